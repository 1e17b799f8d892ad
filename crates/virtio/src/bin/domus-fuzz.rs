//! `domus-fuzz`: runs the virtio fuzz targets (`domus_virtio::fuzz`) and
//! the disk targets (`domus_disk::fuzz`: qcow2 images, partition tables) over a
//! corpus directory and then over random mutations of it until the time is
//! up. A panic aborts the run after saving the input as `crash-<target>-*`
//! in the current directory.
//!
//!   domus-fuzz [--seconds N] [--only TARGET] [--trace FILE] [--write-seeds] CORPUS_DIR
//!
//! This is a mutation fuzzer without coverage feedback (stable Rust, no
//! libFuzzer); the corpus holds well-formed requests of every kind.

use std::cell::RefCell;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use domus_virtio::fuzz::{self, Rng};

thread_local! {
    static CURRENT: RefCell<(&'static str, Vec<u8>)> = const { RefCell::new(("", Vec::new())) };
    /// `--trace FILE`: each input is written there before it runs, for what
    /// the panic hook cannot save (a stack overflow, a failed allocation).
    static TRACE: RefCell<Option<PathBuf>> = const { RefCell::new(None) };
}

/// A named fuzz target.
type Target = (&'static str, fn(&[u8]));

/// Flips, overwrites with interesting values, or copies ranges, biased to
/// the rings and the first pages where descriptors live.
fn mutate(rng: &mut Rng, input: &mut Vec<u8>) {
    if input.len() < 0x4000 {
        input.resize(0x4000, 0);
    }
    let interesting: [u64; 8] = [
        0,
        1,
        0xffff,
        0x8000,
        0xffff_ffff,
        0x1_0000,
        0x3000,
        u64::MAX,
    ];
    for _ in 0..1 + rng.below(8) {
        let region = match rng.below(4) {
            0 => 0..0x400,       // descriptor table
            1 => 0x1000..0x1040, // avail ring
            2 => 0x2ff0..0x4000, // settings, headers, data, indirect tables
            _ => 0..input.len(),
        };
        let at = region.start + rng.below(region.len());
        match rng.below(4) {
            0 => input[at] ^= 1 << rng.below(8),
            1 => input[at] = rng.next_u64() as u8,
            2 => {
                let v = interesting[rng.below(interesting.len())].to_le_bytes();
                let w = [1, 2, 4, 8][rng.below(4)];
                for (i, b) in v[..w].iter().enumerate() {
                    if let Some(x) = input.get_mut(at + i) {
                        *x = *b;
                    }
                }
            }
            _ => {
                let from = rng.below(input.len());
                let len = rng.below(32).min(input.len() - from).min(input.len() - at);
                let chunk = input[from..from + len].to_vec();
                input[at..at + len].copy_from_slice(&chunk);
            }
        }
    }
}

fn run(target: &'static str, f: fn(&[u8]), input: &[u8]) {
    CURRENT.with(|c| *c.borrow_mut() = (target, input.to_vec()));
    TRACE.with(|t| {
        if let Some(p) = &*t.borrow() {
            let _ = std::fs::write(p, input);
        }
    });
    f(input);
}

fn main() {
    let mut args = std::env::args().skip(1);
    let mut seconds = 10u64;
    let mut write_seeds = false;
    let mut only = None;
    let mut dir = None;
    while let Some(a) = args.next() {
        match a.as_str() {
            "--seconds" => seconds = args.next().and_then(|s| s.parse().ok()).unwrap_or(10),
            "--write-seeds" => write_seeds = true,
            "--only" => only = args.next(),
            "--trace" => TRACE.with(|t| *t.borrow_mut() = args.next().map(PathBuf::from)),
            _ => dir = Some(PathBuf::from(a)),
        }
    }
    let Some(dir) = dir else {
        eprintln!("usage: domus-fuzz [--seconds N] [--only TARGET] [--trace FILE] [--write-seeds] CORPUS_DIR");
        std::process::exit(2);
    };
    if write_seeds {
        std::fs::create_dir_all(&dir).expect("corpus dir");
        for (name, data) in fuzz::seeds() {
            std::fs::write(dir.join(name), data).expect("writing a seed");
        }
    }
    std::panic::set_hook(Box::new(|info| {
        CURRENT.with(|c| {
            let (target, input) = &*c.borrow();
            let name = format!(
                "crash-{target}-{:016x}",
                input
                    .iter()
                    .fold(0xcbf29ce484222325u64, |h, b| (h ^ u64::from(*b))
                        .wrapping_mul(0x100000001b3))
            );
            let _ = std::fs::write(&name, input);
            eprintln!("domus-fuzz: {target} panicked: {info}; input saved as {name}");
        });
    }));
    let mut corpus: Vec<Vec<u8>> = std::fs::read_dir(&dir)
        .map(|rd| {
            rd.filter_map(|e| std::fs::read(e.ok()?.path()).ok())
                .collect()
        })
        .unwrap_or_default();
    if corpus.is_empty() {
        corpus = fuzz::seeds().into_iter().map(|(_, d)| d).collect();
    }
    let all: [Target; 7] = [
        ("blk", fuzz::blk_queue),
        ("rng", fuzz::rng_queue),
        ("net-tx", fuzz::net_tx),
        ("net-rx", fuzz::net_rx),
        ("balloon", fuzz::balloon_queue),
        ("qcow2", domus_disk::fuzz::qcow2),
        ("partitions", domus_disk::fuzz::partitions),
    ];
    let targets: Vec<Target> = all
        .into_iter()
        .filter(|(n, _)| only.as_deref().is_none_or(|o| o == *n))
        .collect();
    if targets.is_empty() {
        eprintln!("domus-fuzz: no target {only:?}");
        std::process::exit(2);
    }
    for input in &corpus {
        for &(name, f) in &targets {
            run(name, f, input);
        }
    }
    let seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| d.as_nanos() as u64)
        .unwrap_or(1)
        | 1;
    let mut rng = Rng(seed);
    let end = Instant::now() + Duration::from_secs(seconds);
    let mut runs = 0u64;
    while Instant::now() < end {
        let mut input = corpus[rng.below(corpus.len())].clone();
        mutate(&mut rng, &mut input);
        let (name, f) = targets[rng.below(targets.len())];
        run(name, f, &input);
        runs += 1;
    }
    println!(
        "domus-fuzz: {} corpus inputs, {runs} mutated runs in {seconds} s (seed {seed:#x}), no crashes",
        corpus.len()
    );
}
