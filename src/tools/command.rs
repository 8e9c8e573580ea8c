//! Command tools: a fixed argv, never a shell. The model's arguments arrive
//! as JSON on stdin; stdout (and a failing exit status) is the result. The
//! child runs in its own process group with a cleared environment, and the
//! whole group is killed on timeout, when the call is dropped (the client
//! went away) and when the proxy exits ([`crate::children`]). Both pipes
//! are drained to the end, so a chatty command never dies of a full or
//! closed pipe; only the first `max_output_bytes` of each are kept.

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::{capped_text, CallContext, Outcome, Run};
use crate::children::Group;
use crate::config::file::CommandToolFile;

pub struct CommandTool {
    argv: Vec<String>,
    cwd: Option<String>,
    env: Vec<(String, String)>,
    timeout: Duration,
    /// Longer results are cut (`max_output_bytes`).
    cap: usize,
}

impl CommandTool {
    pub fn from_file(file: CommandToolFile, cap: usize) -> Result<Self, String> {
        if file.argv.is_empty() || file.argv[0].is_empty() {
            return Err("`argv` needs at least the program".into());
        }
        let env = crate::children::environment(&file.inherit_env, &file.env);
        Ok(CommandTool {
            argv: file.argv,
            cwd: file.cwd,
            env,
            timeout: Duration::from_millis(file.timeout_ms),
            cap,
        })
    }

    async fn exec(&self, arguments: &str) -> Outcome {
        let cap = self.cap;
        let mut command = Command::new(&self.argv[0]);
        command
            .args(&self.argv[1..])
            .env_clear()
            .envs(self.env.iter().map(|(k, v)| (k, v)))
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .kill_on_drop(true)
            .process_group(0);
        if let Some(cwd) = &self.cwd {
            command.current_dir(cwd);
        }
        let mut child = match command.spawn() {
            Ok(child) => child,
            Err(e) => return Outcome::error(format!("cannot start `{}`: {e}", self.argv[0])),
        };
        let _group = child.id().and_then(Group::led_by);
        let (Some(mut stdin), Some(stdout), Some(stderr)) =
            (child.stdin.take(), child.stdout.take(), child.stderr.take())
        else {
            return Outcome::error("cannot attach to the command's pipes");
        };
        let input = arguments.as_bytes().to_vec();
        let run = async {
            let feed = async move {
                // A command that ignores stdin may close it early; that is fine.
                let _ = stdin.write_all(&input).await;
            };
            let ((), out, err) =
                tokio::join!(feed, read_capped(stdout, cap), read_capped(stderr, cap));
            (out, err, child.wait().await.ok())
        };
        let (out, err, status) = match tokio::time::timeout(self.timeout, run).await {
            Ok(result) => result,
            Err(_) => {
                return Outcome::error(format!("timed out after {} ms", self.timeout.as_millis()))
            }
        };
        let text = capped_text(&out.kept, cap, out.more);
        match status {
            Some(status) if !status.success() => Outcome::error(format!(
                "{status}\n{text}{}{}",
                if err.kept.is_empty() {
                    ""
                } else {
                    "\nstderr: "
                },
                capped_text(&err.kept, cap, err.more)
            )),
            _ => Outcome::success(text),
        }
    }
}

/// The start of what a command wrote to one pipe.
struct Captured {
    kept: Vec<u8>,
    /// More than `kept` was written (and thrown away).
    more: bool,
}

/// Reads `reader` to its end, keeping the first `cap` bytes: a writer that
/// meets a closed pipe dies of SIGPIPE, one that meets a full pipe blocks.
async fn read_capped(mut reader: impl AsyncRead + Unpin, cap: usize) -> Captured {
    let mut captured = Captured {
        kept: Vec::new(),
        more: false,
    };
    let mut buf = [0u8; 8192];
    while let Ok(n @ 1..) = reader.read(&mut buf).await {
        let room = cap - captured.kept.len();
        captured.kept.extend_from_slice(&buf[..n.min(room)]);
        captured.more |= n > room;
    }
    captured
}

#[async_trait::async_trait]
impl Run for CommandTool {
    async fn run(&self, arguments: &str, _ctx: &CallContext) -> Outcome {
        self.exec(arguments).await
    }
}
