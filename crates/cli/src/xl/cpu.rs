//! vCPU and scheduling verbs: vcpu-list, vcpu-pin, sched-credit and top.

use std::process::ExitCode;

use domus_api::daemon::{
    Domain, HostSched, HostSchedRequest, NameOrNumber, PinRequest, Sched, SchedRequest, State,
};

use super::{failed, or_null, print_json, verb, StateArg};

#[derive(clap::Args)]
pub struct VcpuListArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// Domain name or id (default: all domains).
    pub domain: Option<String>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

pub fn vcpu_list(a: VcpuListArgs) -> ExitCode {
    verb(|| {
        let c = a.state.client()?;
        let doms: Vec<String> = match &a.domain {
            Some(d) => vec![d.clone()],
            None => c
                .list()
                .map_err(failed)?
                .into_iter()
                .filter(|d| d.id != 0)
                .map(|d| d.name)
                .collect(),
        };
        let mut all = Vec::new();
        for d in doms {
            all.extend(c.vcpus(&d).map_err(failed)?);
        }
        if a.json {
            print_json(&all);
            return Ok(ExitCode::SUCCESS);
        }
        println!(
            "{:<24} {:>4} {:>5} {:>7} {:>4} {:>9}  Affinity",
            "Name", "ID", "VCPU", "TID", "CPU", "Time(s)"
        );
        for v in all {
            println!(
                "{:<24} {:>4} {:>5} {:>7} {:>4} {:>9.1}  {}",
                v.name,
                v.id,
                v.vcpu,
                v.tid,
                or_null(v.cpu),
                v.cpu_time_s.unwrap_or(0.0),
                v.affinity.as_deref().unwrap_or("?")
            );
        }
        Ok(ExitCode::SUCCESS)
    })
}

#[derive(clap::Args)]
pub struct VcpuPinArgs {
    #[command(flatten)]
    pub state: StateArg,
    pub domain: String,
    /// vCPU number, or all.
    pub vcpu: String,
    /// Host CPUs: a list like 0-3,6, or all.
    pub cpus: String,
}

pub fn vcpu_pin(a: VcpuPinArgs) -> ExitCode {
    verb(|| {
        let vcpu = match a.vcpu.as_str() {
            "all" => None,
            v => match v.parse::<u64>() {
                Ok(n) => Some(NameOrNumber::Number(n)),
                Err(_) => return Err(format!("'{v}' is not a vCPU number or all")),
            },
        };
        let req = PinRequest { vcpu, cpus: a.cpus };
        a.state.client()?.pin(&a.domain, &req).map_err(failed)?;
        Ok(ExitCode::SUCCESS)
    })
}

#[derive(clap::Args)]
pub struct SchedArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// The domain (default: list every domain's weight and cap).
    #[arg(short = 'd', long = "domain", conflicts_with = "schedparam")]
    pub domain: Option<String>,
    /// Weight, 1 to 65535 (default 256): CPU shares under contention.
    #[arg(short = 'w', long)]
    pub weight: Option<u32>,
    /// Cap in percent of one CPU (0: none).
    #[arg(short = 'c', long)]
    pub cap: Option<u32>,
    /// Show or set (with -t) the host-wide settings instead of a domain's.
    #[arg(short = 's', long = "schedparam")]
    pub schedparam: bool,
    /// With -s: the time slice in ms every domain's vCPU threads ask of
    /// the host's scheduler (Xen's tslice; 1 to 100, Linux 6.12 and later;
    /// 0: the kernel's own base slice, the default).
    #[arg(short = 't', long = "tslice_ms", requires = "schedparam")]
    pub tslice_ms: Option<u32>,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

fn show_sched(s: &Sched) {
    println!("{:<24} {:>4} {:>6} {:>4}", s.name, s.id, s.weight, s.cap);
}

fn sched_header() {
    println!("{:<24} {:>4} {:>6} {:>4}", "Name", "ID", "Weight", "Cap");
}

/// The host-wide settings, as xl shows its CPU pool's.
fn show_host_sched(h: &HostSched) {
    let base = h
        .base_slice_ns
        .map_or("unknown".into(), |ns| format!("{:.2}ms", ns as f64 / 1e6));
    if h.tslice_ms == 0 {
        println!("Host: tslice=default (the kernel's base slice, {base})");
    } else {
        println!(
            "Host: tslice={}ms (the kernel's base slice: {base})",
            h.tslice_ms
        );
    }
}

pub fn sched_credit(a: SchedArgs) -> ExitCode {
    verb(|| {
        let c = a.state.client()?;
        if a.schedparam {
            if a.weight.is_some() || a.cap.is_some() {
                return Err("-w and -c need -d DOMAIN, not -s".into());
            }
            let h = match a.tslice_ms {
                None => c.host_sched(),
                Some(ms) => c.set_host_sched(&HostSchedRequest {
                    tslice_ms: Some(ms),
                }),
            }
            .map_err(failed)?;
            if a.json {
                print_json(&h);
            } else {
                show_host_sched(&h);
            }
            return Ok(ExitCode::SUCCESS);
        }
        let all = match (&a.domain, a.weight, a.cap) {
            (None, None, None) => {
                let doms = c.list().map_err(failed)?;
                let mut all = Vec::new();
                for d in doms.iter().filter(|d| d.id != 0) {
                    all.push(c.sched(&d.id.to_string()).map_err(failed)?);
                }
                all
            }
            (None, _, _) => return Err("-w and -c need -d DOMAIN".into()),
            (Some(d), None, None) => vec![c.sched(d).map_err(failed)?],
            (Some(d), weight, cap) => vec![c
                .set_sched(d, &SchedRequest { weight, cap })
                .map_err(failed)?],
        };
        if a.json {
            print_json(&all);
            return Ok(ExitCode::SUCCESS);
        }
        sched_header();
        for s in &all {
            show_sched(s);
        }
        Ok(ExitCode::SUCCESS)
    })
}

#[derive(clap::Args)]
pub struct TopArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// One sample (over --delay seconds), then exit.
    #[arg(long)]
    pub once: bool,
    /// Print JSON (with --once).
    #[arg(long)]
    pub json: bool,
    /// Seconds between samples.
    #[arg(short = 'd', long, default_value_t = 1.0)]
    pub delay: f64,
}

/// One domain in one `top` sample.
#[derive(serde::Serialize)]
struct TopRow {
    name: String,
    id: i64,
    state: State,
    cpu_s: f64,
    cpu_pct: f64,
    vcpu_pct: f64,
    io_cpu_pct: f64,
    memory_mib: u64,
    maxmem_mib: Option<u64>,
    vcpus: Option<u32>,
    /// What the virtual firewall-router passed and dropped of what the
    /// domain's interfaces sent (since each interface got its rules).
    vfr_passed: u64,
    vfr_dropped: u64,
}

/// One sample: each domain with CPU percentages over `delay`.
fn top_sample(c: &domus_api::client::DaemonClient, delay: f64) -> Result<Vec<TopRow>, String> {
    let a = c.list().map_err(failed)?;
    let t0 = std::time::Instant::now();
    std::thread::sleep(std::time::Duration::from_secs_f64(delay.max(0.1)));
    let b = c.list().map_err(failed)?;
    let dt = t0.elapsed().as_secs_f64();
    Ok(b.into_iter()
        .filter(|d| d.id != 0)
        .map(|d| {
            let before = a.iter().find(|x| x.id == d.id);
            let pct = |f: fn(&Domain) -> f64| match before {
                Some(x) => ((f(&d) - f(x)) / dt * 100.0).max(0.0),
                None => 0.0,
            };
            TopRow {
                cpu_pct: pct(|d| d.cpu_time_s),
                vcpu_pct: pct(|d| d.vcpu_time_s),
                io_cpu_pct: pct(|d| d.io_time_s),
                name: d.name,
                id: d.id,
                state: d.state,
                cpu_s: d.cpu_time_s,
                memory_mib: d.memory_mib,
                maxmem_mib: d.maxmem_mib,
                vcpus: d.vcpus,
                vfr_passed: d.vfr_passed,
                vfr_dropped: d.vfr_dropped,
            }
        })
        .collect())
}

pub fn top(a: TopArgs) -> ExitCode {
    verb(|| {
        let c = a.state.client()?;
        loop {
            let s = top_sample(&c, a.delay)?;
            if a.once && a.json {
                print_json(&s);
                return Ok(ExitCode::SUCCESS);
            }
            if !a.once {
                print!("\x1b[H\x1b[2J");
            }
            println!(
                "{:<24} {:>10} {:>9} {:>7} {:>8} {:>8} {:>8} {:>8} {:>5} {:>9} {:>8}",
                "NAME",
                "STATE",
                "CPU(sec)",
                "CPU(%)",
                "VCPU(%)",
                "IOCPU(%)",
                "MEM(MiB)",
                "MAXMEM",
                "VCPUS",
                "VFRPASS",
                "VFRDROP"
            );
            for d in &s {
                println!(
                    "{:<24} {:>10} {:>9.1} {:>7.1} {:>8.1} {:>8.1} {:>8} {:>8} {:>5} {:>9} {:>8}",
                    d.name,
                    d.state.as_str(),
                    d.cpu_s,
                    d.cpu_pct,
                    d.vcpu_pct,
                    d.io_cpu_pct,
                    d.memory_mib,
                    or_null(d.maxmem_mib),
                    or_null(d.vcpus),
                    d.vfr_passed,
                    d.vfr_dropped
                );
            }
            if a.once {
                return Ok(ExitCode::SUCCESS);
            }
        }
    })
}
