//! Stopping a run early: a watch channel that Ctrl-C or SIGTERM sets (the future that waits
//! for it is `wire::client::stopped`).

use anyhow::{Context, Result};
use tokio::sync::watch;

/// A stop receiver that never fires (library users without signals).
pub fn never_stop() -> watch::Receiver<bool> {
    watch::channel(false).1
}

/// A stop receiver that fires on Ctrl-C or SIGTERM.
pub fn stop_on_signals() -> Result<watch::Receiver<bool>> {
    let (tx, rx) = watch::channel(false);
    let mut term = tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())
        .context("installing the SIGTERM handler")?;
    tokio::spawn(async move {
        tokio::select! {
            _ = tokio::signal::ctrl_c() => {}
            _ = term.recv() => {}
        }
        eprintln!("\nloadgen: stopping; keeping finished requests");
        let _ = tx.send(true);
    });
    Ok(rx)
}
