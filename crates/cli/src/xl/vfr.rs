//! `domus vfr apply|remove|list`: the virtual firewall-router's rules on
//! taps that `domus run` uses outside the daemon (the daemon applies them
//! to its own domains' taps by itself), in nftables table `bridge
//! domus_run`.

use std::process::ExitCode;

use domus_daemon::vfr::{Firewall, Nft, Policy, KINDS};

use super::{print_json, verb};

#[derive(clap::Args)]
pub struct VfrArgs {
    #[command(subcommand)]
    pub verb: VfrVerb,
}

#[derive(clap::Subcommand)]
pub enum VfrVerb {
    /// Put (or replace) a tap's rules: SPEC as a vif's, `mac=` required
    /// (`mac=52:54:00:12:34:56,ip=10.0.0.2,tcp=22 80,isolated=1`).
    Apply { tap: String, spec: String },
    /// Remove a tap's rules.
    Remove { tap: String },
    /// The taps with rules, and what their rules passed and dropped.
    List {
        #[arg(long)]
        json: bool,
    },
}

/// The table of taps outside the daemon.
const TAG: &str = "run";

pub fn vfr(a: VfrArgs) -> ExitCode {
    verb(|| {
        let nft = Nft::new(TAG);
        match a.verb {
            VfrVerb::Apply { tap, spec } => {
                let mut warnings = Vec::new();
                let vif = domus_xlcfg::parse_vif(&spec, &mut warnings)?;
                for w in warnings {
                    eprintln!("domus: warning: {w}");
                }
                let p = Policy::of(&tap, &vif, false)?;
                nft.apply(&p).map_err(|e| e.to_string())?;
            }
            VfrVerb::Remove { tap } => nft.remove(&tap).map_err(|e| e.to_string())?,
            VfrVerb::List { json } => {
                let counts = nft.counters();
                if json {
                    print_json(&counts);
                } else {
                    print!("{:<16}", "Tap");
                    for k in KINDS {
                        print!(" {k:>9}");
                    }
                    println!();
                    for (tap, c) in &counts {
                        print!("{tap:<16}");
                        for k in KINDS {
                            print!(" {:>9}", c.get(k).copied().unwrap_or(0));
                        }
                        println!();
                    }
                }
            }
        }
        Ok(ExitCode::SUCCESS)
    })
}
