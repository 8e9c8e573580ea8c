//! Command tools: a fixed argv, never a shell. The model's arguments arrive
//! as JSON on stdin; stdout (and a failing exit status) is the result. The
//! child runs in its own process group with a cleared environment, and the
//! whole group is killed on timeout, on oversized output and when the call
//! is dropped (the client went away).

use std::process::Stdio;
use std::time::Duration;

use tokio::io::{AsyncRead, AsyncReadExt, AsyncWriteExt};
use tokio::process::Command;

use super::{capped_text, CallContext, Outcome, Run};
use crate::config::file::CommandToolFile;

const STDERR_CAP: usize = 4096;

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
        let mut env: Vec<(String, String)> = file
            .inherit_env
            .iter()
            .filter_map(|name| std::env::var(name).ok().map(|v| (name.clone(), v)))
            .collect();
        env.extend(file.env);
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
        let _group = child.id().map(GroupKill);
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
            let ((), (out, out_overflow), (err, _)) = tokio::join!(
                feed,
                read_capped(stdout, cap),
                read_capped(stderr, STDERR_CAP)
            );
            if out_overflow {
                // It would block on a full pipe forever: stop it now.
                return (out, err, None);
            }
            (out, err, child.wait().await.ok())
        };
        let (out, err, status) = match tokio::time::timeout(self.timeout, run).await {
            Ok(result) => result,
            Err(_) => {
                return Outcome::error(format!("timed out after {} ms", self.timeout.as_millis()))
            }
        };
        let text = capped_text(&out, cap, false);
        match status {
            None => Outcome::success(text),
            Some(status) if status.success() => Outcome::success(text),
            Some(status) => Outcome::error(format!(
                "{status}\n{text}{}{}",
                if err.is_empty() { "" } else { "\nstderr: " },
                String::from_utf8_lossy(&err[..err.len().min(STDERR_CAP)])
            )),
        }
    }
}

/// Reads up to `cap` bytes; the flag says there was more.
async fn read_capped(reader: impl AsyncRead + Unpin, cap: usize) -> (Vec<u8>, bool) {
    let mut buf = Vec::new();
    let _ = reader.take(cap as u64 + 1).read_to_end(&mut buf).await;
    let overflow = buf.len() > cap;
    (buf, overflow)
}

/// Kills the child's whole process group when dropped, so grandchildren a
/// command spawned do not outlive the call.
struct GroupKill(u32);

impl Drop for GroupKill {
    fn drop(&mut self) {
        if let Ok(pgid) = libc::pid_t::try_from(self.0) {
            // SAFETY: killpg has no memory-safety preconditions; the group was
            // created for this child by `process_group(0)`, so its id is ours.
            unsafe {
                libc::killpg(pgid, libc::SIGKILL);
            }
        }
    }
}

#[async_trait::async_trait]
impl Run for CommandTool {
    async fn run(&self, arguments: &str, _ctx: &CallContext) -> Outcome {
        self.exec(arguments).await
    }
}
