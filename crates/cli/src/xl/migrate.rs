//! `domus migrate`: a domain sent live to another host's daemon, with its
//! progress as it goes, or a migration cancelled (docs/migration.md).

use std::process::ExitCode;
use std::time::{Duration, Instant};

use domus_api::daemon::MigrateRequest;
use domus_api::vmm::{MigrationState, MigrationStatus};

use super::{failed, print_json, verb, StateArg};

#[derive(clap::Args)]
pub struct MigrateArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// The longest the guest may stop for the last copy, in milliseconds.
    #[arg(long, value_name = "MS", default_value_t = 300)]
    pub downtime_ms: u64,
    /// Pre-copy rounds after which a migration that has not come under
    /// the downtime gives up (the domain goes on here).
    #[arg(long, value_name = "N", default_value_t = 30)]
    pub max_rounds: u32,
    /// The destination daemon's certificate fingerprint (`domus info`
    /// there) [default: $DOMUS_MIGRATE_FINGERPRINT].
    #[arg(long, value_name = "SHA256:..")]
    pub fingerprint: Option<String>,
    /// A CA file the destination's certificate chains to, instead of
    /// --fingerprint.
    #[arg(long, value_name = "FILE", conflicts_with = "fingerprint")]
    pub ca: Option<std::path::PathBuf>,
    /// A file holding the destination daemon's bearer token (its state
    /// directory's `token`) [default: $DOMUS_MIGRATE_TOKEN_FILE].
    #[arg(long, value_name = "FILE")]
    pub token_file: Option<std::path::PathBuf>,
    /// Cancel the domain's migration instead: it goes on here.
    #[arg(long, conflicts_with = "to")]
    pub cancel: bool,
    /// Print the final status as JSON (progress still goes to stderr).
    #[arg(long)]
    pub json: bool,
    /// Domain name or id.
    pub domain: String,
    /// The destination daemon's TCP API (`domus daemon --listen-tcp`),
    /// HOST:PORT.
    #[arg(required_unless_present = "cancel")]
    pub to: Option<String>,
}

fn progress(s: &MigrationStatus) -> String {
    format!(
        "round {}: {:.1} MiB sent, {} pages dirty, {:.0} MiB/s, downtime if stopped now {:.0} ms",
        s.rounds,
        s.bytes_sent as f64 / f64::from(1 << 20),
        s.dirty_pages,
        s.mib_per_s,
        s.expected_downtime_ms
    )
}

pub fn migrate(a: MigrateArgs) -> ExitCode {
    verb(|| {
        let client = a.state.client()?;
        if a.cancel {
            let s = client.cancel_migration(&a.domain).map_err(failed)?;
            eprintln!(
                "domus: cancelling the migration of {} ({:?})",
                a.domain, s.state
            );
            return Ok(ExitCode::SUCCESS);
        }
        let to = a.to.clone().unwrap_or_default();
        let token_file = a
            .token_file
            .clone()
            .or_else(|| std::env::var_os("DOMUS_MIGRATE_TOKEN_FILE").map(Into::into))
            .ok_or("give the destination's token: --token-file FILE")?;
        let token = std::fs::read_to_string(&token_file)
            .map_err(|e| format!("{}: {e}", token_file.display()))?
            .trim()
            .to_string();
        let fingerprint = a
            .fingerprint
            .clone()
            .or_else(|| std::env::var("DOMUS_MIGRATE_FINGERPRINT").ok());
        if fingerprint.is_none() && a.ca.is_none() {
            return Err("give the destination's certificate: --fingerprint or --ca".into());
        }
        let req = MigrateRequest {
            to: to.clone(),
            token,
            fingerprint,
            ca_file: a.ca.as_ref().map(|p| p.display().to_string()),
            downtime_ms: a.downtime_ms,
            max_rounds: a.max_rounds,
        };
        let t0 = Instant::now();
        eprintln!("domus: migrating {} to {to} ...", a.domain);
        client.migrate(&a.domain, &req).map_err(failed)?;
        let mut shown = 0;
        let s = loop {
            std::thread::sleep(Duration::from_millis(200));
            let s = client.migration(&a.domain).map_err(failed)?;
            if s.rounds != shown && s.state == MigrationState::Copying {
                shown = s.rounds;
                eprintln!("domus: {}", progress(&s));
            }
            if matches!(s.state, MigrationState::Completed | MigrationState::Failed) {
                break s;
            }
        };
        if a.json {
            print_json(&s);
        }
        match s.state {
            MigrationState::Completed => {
                if !a.json {
                    println!(
                        "migrated domain {} to {to} in {:.1} s: {} rounds, {:.1} MiB sent, stopped {:.0} ms",
                        a.domain,
                        t0.elapsed().as_secs_f64(),
                        s.rounds,
                        s.bytes_sent as f64 / f64::from(1 << 20),
                        s.downtime_ms.unwrap_or_default()
                    );
                }
                Ok(ExitCode::SUCCESS)
            }
            _ => Err(format!(
                "the migration of {} failed, it goes on here: {}",
                a.domain,
                s.error.unwrap_or_default()
            )),
        }
    })
}
