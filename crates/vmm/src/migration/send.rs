//! The source side of a live migration (docs/migration.md): pre-copy
//! rounds while the guest runs, then the guest stopped for the last dirty
//! pages and its state, then the destination's word that it runs there.
//!
//! It runs on the API connection that asked for it (`PUT
//! /v1/domain/migrate`), which carries the stream once answered: so it
//! has the API threads' seccomp filters (KVM's dirty log, reads and
//! writes on a socket it holds), and needs no socket of its own. Whatever
//! fails before the destination says `Running`, the guest goes on here as
//! it was.

use std::io::{BufWriter, Write};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::Sender;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use domus_api::migration::{self as stream, Frame, Round, PAGE, PAGES_PER_FRAME};
use domus_api::snapshot::{MemoryImage, MemoryRegion};
use domus_api::vmm::{MigrationState, MigrationStatus};
use domus_devices::bus::lock;
use domus_http::Duplex;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend, GuestMemoryRegion};

use super::dirty::{self, DirtyLog, PageBitmap};
use crate::registry::DeviceSpec;
use crate::snapshot::{Machine, Snapshotter};
use crate::vcpu::Stop;

/// How long the destination has to restore the guest and say so.
const RUNNING_TIMEOUT: Duration = Duration::from_secs(120);
/// Bytes buffered before a write to the stream.
const BUFFER: usize = 1 << 20;

#[derive(Debug, thiserror::Error)]
pub enum SendError {
    #[error("{0}")]
    Stream(#[from] std::io::Error),
    #[error(transparent)]
    Frame(#[from] stream::StreamError),
    #[error(transparent)]
    Dirty(#[from] dirty::DirtyError),
    #[error(transparent)]
    Snapshot(#[from] crate::snapshot::SnapshotError),
    #[error("cancelled")]
    Cancelled,
    #[error("it does not converge: after {rounds} rounds the guest still dirties {dirty_mib:.1} MiB per round, {expected_ms:.0} ms of downtime at {mib_per_s:.0} MiB/s (the target is {target_ms} ms; give a larger --downtime-ms or --max-rounds)")]
    NoConvergence {
        rounds: u32,
        dirty_mib: f64,
        expected_ms: f64,
        mib_per_s: f64,
        target_ms: u64,
    },
    #[error("the destination answered with something other than Running")]
    Unexpected,
    #[error("{why}; and it is left paused here, since {lost}")]
    Lost { why: String, lost: String },
}

/// What a migration is asked to do.
#[derive(Clone, Copy, Debug)]
pub struct Options {
    pub downtime: Duration,
    pub max_rounds: u32,
}

/// The one live migration a VMM may run, and what the API shows of it.
pub struct Migrator {
    pub snap: Arc<Snapshotter>,
    pub status: Arc<Mutex<MigrationStatus>>,
    pub cancel: Arc<AtomicBool>,
    /// Tells the VMM's main thread that the guest left (it exits).
    pub stop: Mutex<Sender<Stop>>,
}

impl Migrator {
    /// Claims the migration; refused if one is under way (or done).
    pub fn begin(&self) -> Result<(), String> {
        let mut st = lock(&self.status);
        if matches!(
            st.state,
            MigrationState::Copying | MigrationState::Stopped | MigrationState::Completed
        ) {
            return Err("a migration of this domain is under way".into());
        }
        *st = MigrationStatus {
            state: MigrationState::Copying,
            ..MigrationStatus::default()
        };
        self.cancel.store(false, Ordering::SeqCst);
        Ok(())
    }

    /// Sends the domain on `to`, once [`Migrator::begin`] claimed it.
    pub fn run(&self, mut to: Box<dyn Duplex>, opts: Options) {
        let r = match self.snap.busy.try_lock() {
            Ok(_one) => self.send(&mut *to, opts),
            Err(_) => Err(SendError::Snapshot(crate::snapshot::SnapshotError::Busy)),
        };
        if let Err(e) = &r {
            // Told before the status changes: a reader of the status then
            // knows the destination was told too.
            let _ = stream::write_abort(&mut to, &e.to_string()).and_then(|()| to.flush());
        }
        let mut st = lock(&self.status);
        match r {
            Ok(downtime) => {
                st.state = MigrationState::Completed;
                st.downtime_ms = Some(downtime.as_secs_f64() * 1000.0);
                eprintln!(
                    "domus: migrated: the guest runs on the destination (stopped {:.0} ms here)",
                    downtime.as_secs_f64() * 1000.0
                );
                let _ = lock(&self.stop).send(Stop::Migrated);
            }
            Err(e) => {
                let why = e.to_string();
                if matches!(e, SendError::Lost { .. }) {
                    eprintln!("domus: migration failed: {why}");
                } else {
                    eprintln!("domus: migration failed, the guest goes on here: {why}");
                }
                st.state = MigrationState::Failed;
                st.error = Some(why);
            }
        }
    }

    /// Sends the domain; returns how long the guest was stopped.
    fn send(&self, to: &mut dyn Duplex, opts: Options) -> Result<Duration, SendError> {
        let snap = &self.snap;
        let mut w = BufWriter::with_capacity(BUFFER, to);
        let regions: Vec<(u64, u64)> = snap
            .mem
            .iter()
            .map(|r| (r.start_addr().0, r.len()))
            .collect();
        stream::write_hello(&mut w, &regions)?;
        let log = DirtyLog::start(&snap.vm, &snap.mem)?;
        let r = self.precopy(&mut w, &log, opts);
        let r = r.and_then(|left| self.stop_and_finish(&mut w, &log, left, &regions));
        // Off again whichever way it went (a completed VMM ends anyway).
        if let Err(e) = log.stop() {
            eprintln!("domus: after the migration, {e}");
        }
        r
    }

    /// Rounds while the guest runs, until what is dirty can be sent within
    /// the downtime; returns what is dirty then.
    fn precopy(
        &self,
        w: &mut impl Write,
        log: &DirtyLog<'_>,
        opts: Options,
    ) -> Result<PageBitmap, SendError> {
        let mut todo: PageBitmap = full(&self.snap.mem);
        let mut rate = 0.0f64; // bytes per second of the last round
        let mut before = u64::MAX; // pages dirty after the round before
        let mut round = 0u32;
        loop {
            round += 1;
            let t0 = Instant::now();
            let (pages, bytes) = self.send_pages(w, &todo, round == 1)?;
            w.flush()?;
            let seconds = t0.elapsed().as_secs_f64();
            if bytes > 0 && seconds > 0.0 {
                rate = bytes as f64 / seconds;
            }
            todo = log.take()?;
            let dirty_pages = dirty::count(&todo);
            let expected = if rate > 0.0 {
                dirty_pages as f64 * PAGE as f64 / rate
            } else {
                f64::INFINITY
            };
            let r = Round {
                round,
                pages,
                bytes,
                seconds,
                dirty_pages,
                expected_downtime_ms: expected * 1000.0,
            };
            stream::write_round(w, &r)?;
            w.flush()?;
            {
                let mut st = lock(&self.status);
                st.rounds = round;
                st.bytes_sent += bytes;
                st.dirty_pages = dirty_pages;
                st.mib_per_s = rate / f64::from(1 << 20);
                st.expected_downtime_ms = r.expected_downtime_ms;
            }
            let fits = expected <= opts.downtime.as_secs_f64();
            if fits && (!still_shrinking(before, dirty_pages) || round >= opts.max_rounds) {
                return Ok(todo);
            }
            before = dirty_pages;
            if round >= opts.max_rounds {
                return Err(SendError::NoConvergence {
                    rounds: round,
                    dirty_mib: (dirty_pages * PAGE as u64) as f64 / f64::from(1 << 20),
                    expected_ms: expected * 1000.0,
                    mib_per_s: rate / f64::from(1 << 20),
                    target_ms: opts.downtime.as_millis() as u64,
                });
            }
        }
    }

    /// Stops the guest, sends the last dirty pages and its state, and
    /// waits for the destination to run it. The guest goes on here if
    /// that fails.
    fn stop_and_finish(
        &self,
        w: &mut BufWriter<&mut dyn Duplex>,
        log: &DirtyLog<'_>,
        left: PageBitmap,
        regions: &[(u64, u64)],
    ) -> Result<Duration, SendError> {
        let snap = &self.snap;
        if self.cancel.load(Ordering::SeqCst) {
            return Err(SendError::Cancelled);
        }
        let stopped = snap.stop()?;
        lock(&self.status).state = MigrationState::Stopped;
        let (devices, was_paused, t0) = (stopped.devices.clone(), stopped.was_paused, stopped.at);
        // The destination opens the disks next (both see the same files):
        // their locks go now, and come back if the guest goes on here.
        for d in &devices {
            if let Some(f) = &d.function {
                lock(&f.transport).release_host();
            }
        }
        let r = (|| {
            let ms = |t: Instant| t.elapsed().as_secs_f64() * 1000.0;
            let stopped_in = ms(t0);
            let t1 = Instant::now();
            let (machine, spec) = snap.machine(stopped)?;
            // What the last round left, and what was written since.
            let mut todo: PageBitmap = left
                .iter()
                .zip(log.take()?)
                .map(|(a, b)| dirty::merge(a, &b))
                .collect();
            vhost_written(&machine, &snap.mem, &mut todo);
            let state_in = ms(t1);
            let t2 = Instant::now();
            let (pages, bytes) = self.send_pages(w, &todo, false)?;
            lock(&self.status).bytes_sent += bytes;
            let image = MemoryImage {
                file: String::new(),
                bytes: regions.iter().map(|r| r.1).sum(),
                crc32: 0,
                pages_stored: 0,
                regions: layout(regions),
            };
            let state = Snapshotter::state_file(machine, spec, None, was_paused, image)?;
            stream::write_state(w, &state)?;
            w.flush()?;
            let sent_in = ms(t2);
            let t3 = Instant::now();
            let to = w.get_mut();
            to.set_read_timeout(Some(RUNNING_TIMEOUT))?;
            match stream::read_frame(to)? {
                Frame::Running => {
                    // Where the downtime went, for whoever tunes it.
                    eprintln!(
                        "domus: migration downtime here: {stopped_in:.1} ms to stop, {state_in:.1} ms to read the state, {sent_in:.1} ms to send {pages} pages and {} KiB of state, {:.1} ms until the destination ran it",
                        state.len() >> 10,
                        ms(t3)
                    );
                    Ok(t0.elapsed())
                }
                _ => Err(SendError::Unexpected),
            }
        })();
        if let Err(e) = r {
            let mut lost = Vec::new();
            for d in &devices {
                if let Some(f) = &d.function {
                    if let Err(e) = lock(&f.transport).reclaim_host() {
                        lost.push(format!("{}: {e}", d.id));
                    }
                }
            }
            if !lost.is_empty() {
                // Another process writes its disk now: running here too
                // would corrupt it.
                return Err(SendError::Lost {
                    why: e.to_string(),
                    lost: lost.join("; "),
                });
            }
            snap.go_on(&devices, was_paused);
            return Err(e);
        }
        r
    }

    /// Sends the pages `todo` marks, as Pages frames (and Zeroes frames
    /// for pages that are zero now, unless `first`: the destination's
    /// memory starts zeroed). Returns the pages and bytes sent.
    fn send_pages(
        &self,
        w: &mut impl Write,
        todo: &PageBitmap,
        first: bool,
    ) -> Result<(u64, u64), SendError> {
        let mut buf = vec![0u8; PAGES_PER_FRAME * PAGE];
        let (mut pages, mut bytes) = (0u64, 0u64);
        for (r, words) in self.snap.mem.iter().zip(todo) {
            for (page, n) in dirty::runs(words, PAGES_PER_FRAME as u64) {
                if self.cancel.load(Ordering::SeqCst) {
                    return Err(SendError::Cancelled);
                }
                let gpa = r.start_addr().0 + page * PAGE as u64;
                let data = &mut buf[..n as usize * PAGE];
                self.snap
                    .mem
                    .read_slice(data, GuestAddress(gpa))
                    .map_err(|e| std::io::Error::other(format!("reading guest memory: {e}")))?;
                for (zero, from, count) in zero_runs(data) {
                    let at = gpa + (from * PAGE) as u64;
                    if zero {
                        if !first {
                            stream::write_zeroes(w, at, count as u64)?;
                            bytes += 32;
                        }
                    } else {
                        stream::write_pages(w, at, &data[from * PAGE..(from + count) * PAGE])?;
                        bytes += (count * PAGE) as u64 + 24;
                    }
                }
                pages += n;
            }
        }
        Ok((pages, bytes))
    }
}

/// Whether another round is worth it once the rest would fit the
/// downtime: while each round leaves markedly fewer dirty pages than the
/// one before (a quarter fewer), the guest's stop shrinks with it, as far
/// as what it writes in the time of a short round; below 64 pages (256
/// KiB) there is little left to win.
fn still_shrinking(before: u64, now: u64) -> bool {
    now >= 64 && (before == u64::MAX || now.saturating_mul(4) < before.saturating_mul(3))
}

/// Every page of every region.
fn full(mem: &domus_virtio::Memory) -> PageBitmap {
    mem.iter()
        .map(|r| {
            let pages = r.len() / PAGE as u64;
            let mut words = vec![u64::MAX; pages.div_ceil(64) as usize];
            if !pages.is_multiple_of(64) {
                if let Some(last) = words.last_mut() {
                    *last = (1u64 << (pages % 64)) - 1;
                }
            }
            words
        })
        .collect()
}

/// The runs of zero and non-zero pages of `data` (whole pages), in order,
/// as (zero, first page, page count).
fn zero_runs(data: &[u8]) -> Vec<(bool, usize, usize)> {
    static ZERO: [u8; PAGE] = [0; PAGE];
    let mut out: Vec<(bool, usize, usize)> = Vec::new();
    for (i, page) in data.chunks(PAGE).enumerate() {
        let zero = page == &ZERO[..page.len()];
        match out.last_mut() {
            Some((z, _, n)) if *z == zero => *n += 1,
            _ => out.push((zero, i, 1)),
        }
    }
    out
}

/// The regions laid out one after the other, as a snapshot's memory
/// image lists them.
fn layout(regions: &[(u64, u64)]) -> Vec<MemoryRegion> {
    let mut at = 0;
    regions
        .iter()
        .map(|&(guest_addr, bytes)| {
            let r = MemoryRegion {
                guest_addr,
                bytes,
                file_offset: at,
            };
            at += bytes;
            r
        })
        .collect()
}

/// Marks in `todo` what the kernel's vhost-vsock may have written without
/// a trace in either dirty log: each vsock queue's used ring and every
/// buffer its descriptor table points at (the guest's receive buffers).
/// The destination resets the vsock transport, so connections do not
/// survive the move; this keeps the rings and buffers the guest's driver
/// reads next consistent.
fn vhost_written(m: &Machine, mem: &domus_virtio::Memory, todo: &mut PageBitmap) {
    /// A buffer longer than this is not a receive buffer (hostile table).
    const MAX_BUFFER: u64 = 64 << 10;
    for d in &m.devices {
        if !matches!(d.spec, DeviceSpec::Vsock { .. }) {
            continue;
        }
        for q in d.transport.queues.iter().filter(|q| q.ready) {
            let size = u64::from(q.size);
            mark(mem, todo, q.used_ring, 6 + 8 * size);
            for i in 0..size {
                let at = GuestAddress(q.desc_table.wrapping_add(16 * i));
                let (Ok(addr), Ok(len)) = (
                    mem.read_obj::<u64>(at),
                    mem.read_obj::<u32>(GuestAddress(at.0.wrapping_add(8))),
                ) else {
                    break;
                };
                mark(mem, todo, addr, u64::from(len).min(MAX_BUFFER));
            }
        }
    }
}

/// Marks the pages of `len` bytes at `gpa` in `todo`, as far as they lie
/// in guest RAM.
fn mark(mem: &domus_virtio::Memory, todo: &mut PageBitmap, gpa: u64, len: u64) {
    if len == 0 {
        return;
    }
    let first = gpa / PAGE as u64;
    let last = gpa.saturating_add(len - 1) / PAGE as u64;
    for (r, words) in mem.iter().zip(todo.iter_mut()) {
        let start = r.start_addr().0 / PAGE as u64;
        let end = start + r.len() / PAGE as u64;
        for p in first.max(start)..=last.min(end.saturating_sub(1)) {
            if p < start || p >= end {
                continue;
            }
            let i = (p - start) as usize;
            if let Some(word) = words.get_mut(i / 64) {
                *word |= 1 << (i % 64);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rounds_go_on_while_the_dirty_pages_shrink() {
        // After the first round, another if more than 256 KiB is dirty.
        assert!(still_shrinking(u64::MAX, 5000));
        assert!(!still_shrinking(u64::MAX, 63));
        // Then while each round leaves a quarter fewer.
        assert!(still_shrinking(5000, 3000));
        assert!(!still_shrinking(5000, 4000));
        assert!(!still_shrinking(3000, 60));
    }

    #[test]
    fn pages_split_into_zero_and_data_runs() {
        let mut d = vec![0u8; 5 * PAGE];
        d[PAGE + 7] = 1;
        d[2 * PAGE] = 1;
        d[4 * PAGE + 4095] = 9;
        assert_eq!(
            zero_runs(&d),
            vec![(true, 0, 1), (false, 1, 2), (true, 3, 1), (false, 4, 1)]
        );
    }

    #[test]
    fn marks_stay_inside_guest_ram() {
        let mem = domus_virtio::Memory::from_ranges(&[
            (GuestAddress(0), 64 * PAGE),
            (GuestAddress(0x1_0000_0000), 128 * PAGE),
        ])
        .unwrap();
        let all = full(&mem);
        assert_eq!(dirty::count(&all), 192);
        let mut todo: PageBitmap = vec![vec![0; 1], vec![0; 2]];
        // Across a page boundary; past the end of the first region; far
        // outside; a length that would overflow.
        mark(&mem, &mut todo, 0x1ff0, 0x20);
        mark(&mem, &mut todo, 63 * PAGE as u64, 10 * PAGE as u64);
        mark(&mem, &mut todo, 0x8000_0000, PAGE as u64);
        mark(&mem, &mut todo, u64::MAX - 5, 100);
        mark(&mem, &mut todo, 0x1_0000_0000 + 127 * PAGE as u64, 1);
        assert_eq!(dirty::runs(&todo[0], 256), vec![(1, 2), (63, 1)]);
        assert_eq!(dirty::runs(&todo[1], 256), vec![(127, 1)]);
    }
}
