//! Servers started by the load generator (`loadgen compare --a-cmd …`): a free port, the
//! command run through `sh -c` with its output in a log file, a wait for `GET /health` = 200,
//! and a stop by SIGTERM (SIGKILL after a grace period). Also what a server says about itself
//! (`/v1/models`, `/version`), for `meta.json`.

use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{bail, Context, Result};
use tokio::process::{Child, Command};

/// How long a stopped server may take to exit after SIGTERM before it is killed.
pub const STOP_GRACE: Duration = Duration::from_secs(30);

/// A port that was free a moment ago (bound to 127.0.0.1:0, then released).
pub fn free_port() -> Result<u16> {
    let listener =
        std::net::TcpListener::bind("127.0.0.1:0").context("finding a free port on 127.0.0.1")?;
    Ok(listener.local_addr()?.port())
}

/// `command` with every `{port}` replaced by `port`, or with ` --port PORT` appended when it
/// has no `{port}`.
pub fn command_for_port(command: &str, port: u16) -> String {
    if command.contains("{port}") {
        command.replace("{port}", &port.to_string())
    } else {
        format!("{command} --port {port}")
    }
}

/// A server process this tool started.
pub struct ServerProcess {
    child: Child,
    /// Base URL (`http://127.0.0.1:PORT`).
    pub url: String,
    /// The command line as run (port filled in).
    pub command: String,
    pub log: PathBuf,
}

/// Starts `command` (with a free port filled in) and waits until `GET /health` answers 200,
/// at most `timeout`. The server's stdout and stderr go to `log`.
pub async fn start(command: &str, log: &Path, timeout: Duration) -> Result<ServerProcess> {
    let port = free_port()?;
    let command = command_for_port(command, port);
    if let Some(dir) = log.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let out = std::fs::File::create(log).with_context(|| format!("creating {}", log.display()))?;
    let err = out
        .try_clone()
        .with_context(|| format!("opening {}", log.display()))?;
    let child = Command::new("sh")
        .arg("-c")
        .arg(format!("exec {command}"))
        .stdin(Stdio::null())
        .stdout(out)
        .stderr(err)
        .kill_on_drop(true)
        .spawn()
        .with_context(|| format!("starting `{command}`"))?;
    let mut server = ServerProcess {
        child,
        url: format!("http://127.0.0.1:{port}"),
        command,
        log: log.to_path_buf(),
    };
    if let Err(e) = server.wait_healthy(timeout).await {
        let tail = log_tail(log);
        server.stop().await?;
        return Err(e.context(format!("server log {}:\n{tail}", log.display())));
    }
    Ok(server)
}

/// The last 20 lines of a server's log.
pub fn log_tail(log: &Path) -> String {
    let text = std::fs::read_to_string(log).unwrap_or_default();
    let lines: Vec<&str> = text.lines().collect();
    lines[lines.len().saturating_sub(20)..].join("\n")
}

impl ServerProcess {
    /// Whether the server has exited.
    pub fn exited(&mut self) -> bool {
        !matches!(self.child.try_wait(), Ok(None))
    }

    async fn wait_healthy(&mut self, timeout: Duration) -> Result<()> {
        let client = reqwest::Client::builder()
            .timeout(Duration::from_secs(2))
            .build()
            .context("building the health-check client")?;
        let deadline = Instant::now() + timeout;
        let health = format!("{}/health", self.url);
        loop {
            if let Some(status) = self.child.try_wait().context("polling the server")? {
                bail!(
                    "`{}` exited with {status} before /health answered 200",
                    self.command
                );
            }
            let ok = client
                .get(&health)
                .send()
                .await
                .is_ok_and(|r| r.status() == reqwest::StatusCode::OK);
            if ok {
                return Ok(());
            }
            if Instant::now() >= deadline {
                bail!(
                    "`{}`: GET {health} did not answer 200 within {:?}",
                    self.command,
                    timeout
                );
            }
            tokio::time::sleep(Duration::from_millis(100)).await;
        }
    }

    /// Sends SIGTERM and waits for the exit (SIGKILL after [`STOP_GRACE`]).
    pub async fn stop(mut self) -> Result<()> {
        if self.child.try_wait()?.is_some() {
            return Ok(());
        }
        if let Some(pid) = self.child.id() {
            let _ = Command::new("kill")
                .arg("-TERM")
                .arg(pid.to_string())
                .status()
                .await;
        }
        match tokio::time::timeout(STOP_GRACE, self.child.wait()).await {
            Ok(status) => {
                status.with_context(|| format!("waiting for `{}` to exit", self.command))?;
            }
            Err(_) => {
                eprintln!(
                    "loadgen: `{}` still running {STOP_GRACE:?} after SIGTERM: killing it",
                    self.command
                );
                self.child
                    .kill()
                    .await
                    .with_context(|| format!("killing `{}`", self.command))?;
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn port_is_substituted_or_appended() {
        assert_eq!(
            command_for_port("engine serve --port {port} --x", 81),
            "engine serve --port 81 --x"
        );
        assert_eq!(
            command_for_port("engine serve", 82),
            "engine serve --port 82"
        );
        assert_ne!(free_port().unwrap(), 0);
    }

    #[tokio::test]
    async fn a_server_that_exits_early_is_an_error_with_its_log() {
        let dir = tempfile::tempdir().unwrap();
        let log = dir.path().join("server.log");
        let err = start("echo starting; exit 3; true", &log, Duration::from_secs(5))
            .await
            .err()
            .unwrap();
        let text = format!("{err:#}");
        assert!(text.contains("before /health answered 200"), "{text}");
        assert!(text.contains("starting"), "{text}");
    }
}
