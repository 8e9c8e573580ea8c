//! The processes under test: started, weighed through /proc, and stopped.

use std::fs;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use anyhow::{bail, Context};

/// A child process, stopped (SIGTERM, then reaped) when dropped.
pub struct Process {
    name: &'static str,
    child: std::process::Child,
}

impl Process {
    /// Starts `command` with its output in `log` and waits until `addr`
    /// accepts connections.
    pub fn start(
        name: &'static str,
        mut command: Command,
        log: &Path,
        addr: SocketAddr,
    ) -> anyhow::Result<Process> {
        let out = fs::File::create(log)?;
        let child = command
            .stdin(Stdio::null())
            .stdout(out.try_clone()?)
            .stderr(out)
            .spawn()
            .with_context(|| format!("starting {name}"))?;
        let mut process = Process { name, child };
        let deadline = Instant::now() + Duration::from_secs(20);
        while TcpStream::connect(addr).is_err() {
            if let Some(status) = process.child.try_wait()? {
                bail!(
                    "{name} exited ({status}): {}",
                    fs::read_to_string(log).unwrap_or_default()
                );
            }
            if Instant::now() > deadline {
                bail!("{name} is not listening on {addr}");
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        Ok(process)
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    /// Resident memory of the process and its children.
    pub fn rss_kib(&self) -> u64 {
        tree(self.pid())
            .iter()
            .map(|pid| status_kib(*pid, "VmRSS:"))
            .sum()
    }

    /// CPU time (user + system) of the process and its children so far.
    pub fn cpu(&self) -> Duration {
        let ticks: u64 = tree(self.pid()).iter().map(|pid| cpu_ticks(*pid)).sum();
        from_ticks(ticks)
    }
}

/// CPU time (user + system) of this process, the load generator, so far.
pub fn own_cpu() -> Duration {
    from_ticks(cpu_ticks(std::process::id()))
}

/// CPU time the whole machine has been busy so far, all cores: everything
/// in /proc/stat's `cpu` line but idle and iowait.
pub fn machine_busy() -> Duration {
    let stat = fs::read_to_string("/proc/stat").unwrap_or_default();
    let fields: Vec<u64> = stat
        .lines()
        .next()
        .and_then(|line| line.strip_prefix("cpu "))
        .map(|rest| {
            rest.split_whitespace()
                .filter_map(|f| f.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    // user nice system idle iowait irq softirq steal (guest time is in user).
    let busy: u64 = fields
        .iter()
        .take(8)
        .enumerate()
        .filter(|(i, _)| !matches!(i, 3 | 4))
        .map(|(_, ticks)| ticks)
        .sum();
    from_ticks(busy)
}

fn from_ticks(ticks: u64) -> Duration {
    // SAFETY: sysconf has no preconditions.
    let ticks_per_second = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as f64;
    Duration::from_secs_f64(ticks as f64 / ticks_per_second)
}

impl Process {
    /// SIGTERM, then SIGKILL if it lingers; reaped either way.
    pub fn stop(&mut self) {
        if let Ok(Some(_)) = self.child.try_wait() {
            return;
        }
        // SAFETY: signalling our own child, which has not been reaped yet.
        unsafe { libc::kill(self.child.id() as libc::pid_t, libc::SIGTERM) };
        let deadline = Instant::now() + Duration::from_secs(5);
        while Instant::now() < deadline {
            if let Ok(Some(_)) = self.child.try_wait() {
                return;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
        eprintln!("{} ignored SIGTERM; killing it", self.name);
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

impl Drop for Process {
    fn drop(&mut self) {
        self.stop();
    }
}

/// `pid` and all its descendants.
fn tree(pid: u32) -> Vec<u32> {
    let mut pids = vec![pid];
    let mut i = 0;
    while i < pids.len() {
        let tasks = fs::read_dir(format!("/proc/{}/task", pids[i]));
        for task in tasks.into_iter().flatten().flatten() {
            let children = fs::read_to_string(task.path().join("children")).unwrap_or_default();
            pids.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
        i += 1;
    }
    pids
}

fn status_kib(pid: u32, key: &str) -> u64 {
    fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|line| line.strip_prefix(key))
        .and_then(|rest| rest.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}

fn cpu_ticks(pid: u32) -> u64 {
    let stat = fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    // Fields after the parenthesised command name: utime and stime are the
    // 12th and 13th.
    let after_name = stat.rsplit_once(')').map_or("", |(_, rest)| rest);
    let fields: Vec<&str> = after_name.split_whitespace().collect();
    let field = |i: usize| {
        fields
            .get(i)
            .and_then(|f| f.parse::<u64>().ok())
            .unwrap_or(0)
    };
    field(11) + field(12)
}

/// A port nobody listens on right now.
pub fn free_addr() -> anyhow::Result<SocketAddr> {
    Ok(TcpListener::bind("127.0.0.1:0")?.local_addr()?)
}

/// Lets this process and its children hold thousands of sockets.
pub fn raise_open_files_limit() {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: plain syscalls on a valid, owned struct.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &mut limit) == 0 {
            limit.rlim_cur = limit.rlim_max;
            libc::setrlimit(libc::RLIMIT_NOFILE, &limit);
        }
    }
}

/// What the results were measured on.
pub fn machine() -> String {
    let read = |path: &str| fs::read_to_string(path).unwrap_or_default();
    let cpuinfo = read("/proc/cpuinfo");
    let cpu = cpuinfo
        .lines()
        .find_map(|l| l.strip_prefix("model name"))
        .map(|l| l.trim_start_matches([' ', '\t', ':']).to_owned())
        .unwrap_or_else(|| "unknown CPU".into());
    let cores = std::thread::available_parallelism().map_or(0, |n| n.get());
    let mem_gib = read("/proc/meminfo")
        .lines()
        .find_map(|l| l.strip_prefix("MemTotal:"))
        .and_then(|l| l.split_whitespace().next()?.parse::<f64>().ok())
        .map_or(0.0, |kib| kib / 1024.0 / 1024.0);
    let kernel = read("/proc/sys/kernel/osrelease");
    let nginx = Command::new("nginx")
        .arg("-v")
        .output()
        .map(|o| String::from_utf8_lossy(&o.stderr).trim().to_owned())
        .unwrap_or_default();
    format!(
        "{cores} cores ({cpu}), {mem_gib:.1} GiB memory, Linux {}, {}",
        kernel.trim(),
        nginx.trim_start_matches("nginx version: ")
    )
}
