//! `domus save`, `domus restore` and `domus clone`: a domain written to a
//! snapshot and started again from it, once or many times, through the
//! daemon.

use std::path::PathBuf;
use std::process::ExitCode;

use domus_api::daemon::{CloneRequest, RestoreRequest, SaveRequest};

use super::{failed, print_json, verb, StateArg};

#[derive(clap::Args)]
pub struct SaveArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// Leave the domain paused after saving it, instead of destroying it.
    #[arg(short = 'p')]
    pub pause: bool,
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
    /// Domain name or id.
    pub domain: String,
    /// The snapshot's state file (its memory goes beside it as FILE.mem),
    /// in a directory the daemon serves images from; neither may exist.
    pub file: PathBuf,
}

#[derive(clap::Args)]
pub struct RestoreArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
    /// A snapshot `domus save` wrote, in a directory the daemon serves
    /// images from.
    pub file: PathBuf,
    /// `name=NAME`: restore under another name (the domain's only setting
    /// a restore may change).
    pub overrides: Vec<String>,
}

#[derive(clap::Args)]
pub struct CloneArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// Print the answer as JSON.
    #[arg(long)]
    pub json: bool,
    /// A snapshot `domus save` wrote, in a directory the daemon serves
    /// images from.
    pub file: PathBuf,
    /// How many clones (1 to 256).
    pub count: u32,
    /// The clones are named PREFIX-1 to PREFIX-N (default: the saved
    /// domain's name).
    pub prefix: Option<String>,
}

/// The path as given, made absolute against the current directory (the
/// daemon has its own).
fn absolute(p: &std::path::Path) -> Result<String, String> {
    std::path::absolute(p)
        .map(|p| p.display().to_string())
        .map_err(|e| format!("{}: {e}", p.display()))
}

pub fn save(a: SaveArgs) -> ExitCode {
    verb(|| {
        let req = SaveRequest {
            file: absolute(&a.file)?,
            pause: a.pause,
        };
        eprintln!("domus: saving domain {} to {} ...", a.domain, req.file);
        let s = a.state.client()?.save(&a.domain, &req).map_err(failed)?;
        if a.json {
            print_json(&s);
        } else {
            println!(
                "saved domain {} to {} and {} ({} MiB of memory, {} MiB written; stopped for {:.0} ms); {}",
                a.domain,
                s.file,
                s.memory_file,
                s.memory_bytes >> 20,
                (s.pages_stored * 4096) >> 20,
                s.paused_ms,
                if s.destroyed {
                    "it is destroyed"
                } else {
                    "it is paused"
                }
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub fn restore(a: RestoreArgs) -> ExitCode {
    verb(|| {
        let mut name = None;
        for o in &a.overrides {
            match o.split_once('=') {
                Some(("name", v)) => name = Some(v.to_string()),
                _ => {
                    return Err(format!(
                    "'{o}': a restore can only change the name (name=NAME); the rest is as saved"
                ))
                }
            }
        }
        let req = RestoreRequest {
            file: absolute(&a.file)?,
            name,
        };
        let c = a.state.client()?.restore(&req).map_err(failed)?;
        if a.json {
            print_json(&c);
        } else {
            let d = &c.domain;
            println!("domain {} (id {}) restored from {}", d.name, d.id, req.file);
        }
        Ok(ExitCode::SUCCESS)
    })
}

pub fn clone(a: CloneArgs) -> ExitCode {
    verb(|| {
        let req = CloneRequest {
            file: absolute(&a.file)?,
            count: a.count,
            prefix: a.prefix.clone(),
        };
        eprintln!(
            "domus: cloning {} domains from {}: copying writable disks, restoring, then \
             giving each its own MACs ...",
            a.count, req.file
        );
        let c = a.state.client()?.clone_snapshot(&req).map_err(failed)?;
        if a.json {
            print_json(&c);
        } else {
            for d in &c.domains {
                println!("domain {} (id {}) cloned from {}", d.name, d.id, req.file);
            }
            for p in &c.disks {
                println!("disk copy {p}");
            }
            println!(
                "{} clones running after {:.0} ms",
                c.domains.len(),
                c.elapsed_ms
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}
