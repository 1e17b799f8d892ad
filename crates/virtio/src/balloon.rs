//! virtio-balloon (type 5): inflate and deflate, statistics, and free page
//! reporting.
//!
//! * The host sets a target ([`BalloonHandle::set_target_pages`]); the
//!   driver inflates towards it, handing over 4 KiB page frame numbers on
//!   the inflate queue, and the device drops those pages from the VMM
//!   (`madvise(MADV_DONTNEED)`), so the VMM's RSS falls. Deflated pages need
//!   nothing: they fault back in, zeroed, when the guest touches them.
//! * Statistics: the driver's one buffer on the stats queue is kept by the
//!   device and handed back whenever fresh numbers are wanted.
//! * Free page reporting: the driver reports ranges of free memory (2 MiB
//!   and up on Linux) on the reporting queue; the device drops them too, so
//!   memory the guest frees goes back to the host without any target.
//!
//! Page numbers and ranges are guest input: anything outside guest RAM is
//! skipped and counted, never touched.

use std::sync::atomic::{AtomicU32, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use virtio_queue::{Queue, QueueT};
use vm_memory::bitmap::Bitmap;
use vm_memory::{Bytes, GuestAddress, GuestMemoryBackend};
use vmm_sys_util::eventfd::EventFd;

use crate::epoll::Poller;
use crate::{ActivateError, Activation, DeviceThread, Interrupt, Memory, VirtioDevice};

pub const F_STATS_VQ: u64 = 1 << 1;
pub const F_DEFLATE_ON_OOM: u64 = 1 << 2;
pub const F_REPORTING: u64 = 1 << 5;

const QUEUE_SIZE: u16 = 256;
const PAGE_SHIFT: u32 = 12;
const PAGE_SIZE: u64 = 1 << PAGE_SHIFT;
const Q_INFLATE: usize = 0;
const Q_DEFLATE: usize = 1;
/// How often the statistics are refreshed without being asked.
const STATS_PERIOD: Duration = Duration::from_secs(5);
/// The most page numbers read from one descriptor.
const MAX_PFNS_PER_DESC: u32 = 1 << 16;

/// Names of the statistics tags of the virtio spec (5.5.6.3).
pub fn stat_name(tag: u16) -> Option<&'static str> {
    Some(match tag {
        0 => "swap_in",
        1 => "swap_out",
        2 => "major_faults",
        3 => "minor_faults",
        4 => "free_memory",
        5 => "total_memory",
        6 => "available_memory",
        7 => "disk_caches",
        8 => "hugetlb_allocations",
        9 => "hugetlb_failures",
        10 => "oom_kills",
        11 => "alloc_stalls",
        12 => "async_scans",
        13 => "direct_scans",
        14 => "async_reclaims",
        15 => "direct_reclaims",
        _ => return None,
    })
}

/// The driver's last statistics (tag, value) and when they came.
type Statistics = (Vec<(u16, u64)>, Option<Instant>);

/// What the API shares with the device.
pub struct BalloonHandle {
    /// Pages the host wants in the balloon (config `num_pages`).
    target: AtomicU32,
    /// Pages the driver says are in the balloon (config `actual`).
    actual: AtomicU32,
    pub inflated_pages: AtomicU64,
    pub deflated_pages: AtomicU64,
    pub reported_bytes: AtomicU64,
    /// Page numbers or ranges outside guest RAM, skipped.
    pub bad_ranges: AtomicU64,
    stats: Mutex<Statistics>,
    /// Wakes the device thread: the target changed or statistics are wanted.
    wake: EventFd,
}

impl BalloonHandle {
    pub fn new() -> std::io::Result<Self> {
        Ok(Self {
            target: AtomicU32::new(0),
            actual: AtomicU32::new(0),
            inflated_pages: AtomicU64::new(0),
            deflated_pages: AtomicU64::new(0),
            reported_bytes: AtomicU64::new(0),
            bad_ranges: AtomicU64::new(0),
            stats: Mutex::new((Vec::new(), None)),
            wake: EventFd::new(libc::EFD_NONBLOCK)?,
        })
    }

    pub fn target_pages(&self) -> u64 {
        self.target.load(Ordering::SeqCst).into()
    }

    pub fn actual_pages(&self) -> u64 {
        self.actual.load(Ordering::SeqCst).into()
    }

    /// Sets the balloon's target size (clamped to what the config field
    /// holds) and tells the driver.
    pub fn set_target_pages(&self, pages: u64) {
        self.target
            .store(pages.min(u64::from(u32::MAX)) as u32, Ordering::SeqCst);
        let _ = self.wake.write(1);
    }

    /// The last statistics the driver gave, and how old they are; asks for
    /// fresh ones.
    pub fn statistics(&self) -> (Vec<(u16, u64)>, Option<Duration>) {
        let _ = self.wake.write(1);
        let s = self.stats.lock().unwrap_or_else(|e| e.into_inner());
        (s.0.clone(), s.1.map(|t| t.elapsed()))
    }

    /// Waits up to `timeout` for statistics newer than `since`.
    pub fn wait_statistics(&self, since: Instant, timeout: Duration) {
        let end = Instant::now() + timeout;
        while Instant::now() < end {
            let fresh = self
                .stats
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .1
                .is_some_and(|t| t >= since);
            if fresh {
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
    }

    fn store_stats(&self, s: Vec<(u16, u64)>) {
        *self.stats.lock().unwrap_or_else(|e| e.into_inner()) = (s, Some(Instant::now()));
    }
}

impl crate::Stats for BalloonHandle {
    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("target_pages", self.target_pages()),
            ("actual_pages", self.actual_pages()),
            (
                "inflated_pages",
                self.inflated_pages.load(Ordering::Relaxed),
            ),
            (
                "deflated_pages",
                self.deflated_pages.load(Ordering::Relaxed),
            ),
            (
                "reported_bytes",
                self.reported_bytes.load(Ordering::Relaxed),
            ),
            ("bad_ranges", self.bad_ranges.load(Ordering::Relaxed)),
        ]
    }
}

pub struct Balloon {
    handle: Arc<BalloonHandle>,
    running: Option<DeviceThread>,
}

impl Balloon {
    pub fn new() -> std::io::Result<Self> {
        Ok(Self {
            handle: Arc::new(BalloonHandle::new()?),
            running: None,
        })
    }

    pub fn handle(&self) -> Arc<BalloonHandle> {
        self.handle.clone()
    }
}

/// Drops the guest pages `[gpa, gpa + len)` (cut inwards to whole pages)
/// from the VMM. Returns false if the range is not all guest RAM.
pub fn discard(mem: &Memory, gpa: u64, len: u64) -> bool {
    let start = gpa.checked_add(PAGE_SIZE - 1).map(|a| a & !(PAGE_SIZE - 1));
    let end = gpa.checked_add(len).map(|e| e & !(PAGE_SIZE - 1));
    let (Some(start), Some(end)) = (start, end) else {
        return false;
    };
    if end <= start {
        return len == 0 || end == start;
    }
    let Ok(slice) = mem.get_slice(GuestAddress(start), (end - start) as usize) else {
        return false;
    };
    // The pages read as zeroes from now on: changed, for a migration.
    slice.bitmap().mark_dirty(0, slice.len());
    let guard = slice.ptr_guard_mut();
    // SAFETY: the slice lies inside one guest RAM mapping (get_slice checked
    // it), page-aligned. MADV_DONTNEED on that private anonymous mapping
    // only replaces its pages with zero pages on the next touch: the
    // mapping stays valid for every thread that still uses it.
    let r = unsafe {
        libc::madvise(
            guard.as_ptr().cast(),
            (end - start) as usize,
            libc::MADV_DONTNEED,
        )
    };
    r == 0
}

struct Engine {
    mem: Arc<Memory>,
    handle: Arc<BalloonHandle>,
    irq: Interrupt,
    inflate: Option<Queue>,
    deflate: Option<Queue>,
    stats: Option<(usize, Queue)>,
    reporting: Option<(usize, Queue)>,
    /// The stats buffer the driver left with the device.
    stats_head: Option<u16>,
    stats_asked: Option<Instant>,
    last_target: u32,
}

/// Pops every chain of `q`, hands each descriptor (address, length,
/// device-writable) to `f`, and completes the chain with length 0. Returns
/// whether the driver wants an interrupt.
pub fn drain(mem: &Memory, q: &mut Queue, mut f: impl FnMut(u64, u32, bool)) -> bool {
    let mut used = false;
    loop {
        if q.disable_notification(mem).is_err() {
            return used;
        }
        while let Some(chain) = q.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            for d in chain {
                f(d.addr().0, d.len(), d.is_write_only());
            }
            if q.add_used(mem, head, 0).is_err() {
                return used;
            }
            used = true;
        }
        match q.enable_notification(mem) {
            Ok(true) if !crate::ring_corrupt(q, mem) => continue,
            _ => break,
        }
    }
    used && q.needs_notification(mem).unwrap_or(true)
}

/// Reads the page numbers in `[addr, addr + len)` and calls `f` on runs
/// of consecutive pages (first page, count).
pub fn pfn_runs(mem: &Memory, addr: u64, len: u32, mut f: impl FnMut(u64, u64)) {
    let n = (len / 4).min(MAX_PFNS_PER_DESC);
    let mut run: Option<(u64, u64)> = None;
    for i in 0..n {
        let Some(a) = addr.checked_add(u64::from(i) * 4) else {
            break;
        };
        let Ok(pfn) = mem.read_obj::<u32>(GuestAddress(a)) else {
            break;
        };
        let pfn = u64::from(u32::from_le(pfn));
        run = match run {
            Some((s, c)) if s + c == pfn => Some((s, c + 1)),
            Some((s, c)) => {
                f(s, c);
                Some((pfn, 1))
            }
            None => Some((pfn, 1)),
        };
    }
    if let Some((s, c)) = run {
        f(s, c);
    }
}

impl Engine {
    fn inflate(&mut self) {
        let (mem, h) = (&*self.mem, &*self.handle);
        let Some(q) = self.inflate.as_mut() else {
            return;
        };
        let notify = drain(mem, q, |addr, len, _| {
            pfn_runs(mem, addr, len, |pfn, count| {
                if discard(mem, pfn << PAGE_SHIFT, count << PAGE_SHIFT) {
                    h.inflated_pages.fetch_add(count, Ordering::Relaxed);
                } else {
                    h.bad_ranges.fetch_add(1, Ordering::Relaxed);
                }
            })
        });
        if notify {
            self.irq.queue(Q_INFLATE);
        }
    }

    fn deflate(&mut self) {
        let (mem, h) = (&*self.mem, &*self.handle);
        let Some(q) = self.deflate.as_mut() else {
            return;
        };
        let notify = drain(mem, q, |addr, len, _| {
            pfn_runs(mem, addr, len, |_, count| {
                h.deflated_pages.fetch_add(count, Ordering::Relaxed);
            })
        });
        if notify {
            self.irq.queue(Q_DEFLATE);
        }
    }

    fn report(&mut self) {
        let (mem, h) = (&*self.mem, &*self.handle);
        let Some((idx, q)) = self.reporting.as_mut() else {
            return;
        };
        let notify = drain(mem, q, |addr, len, _| {
            if discard(mem, addr, len.into()) {
                h.reported_bytes.fetch_add(len.into(), Ordering::Relaxed);
            } else {
                h.bad_ranges.fetch_add(1, Ordering::Relaxed);
            }
        });
        if notify {
            self.irq.queue(*idx);
        }
    }

    /// Takes the driver's (refreshed) stats buffer and keeps it.
    fn stats_arrived(&mut self) {
        let mem = &*self.mem;
        let Some((_, q)) = self.stats.as_mut() else {
            return;
        };
        while let Some(chain) = q.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let mut out = Vec::new();
            for d in chain.readable() {
                let entries = (d.len() / 10).min(64);
                for i in 0..entries {
                    let a = d.addr().0 + u64::from(i) * 10;
                    let mut b = [0u8; 10];
                    if mem.read_slice(&mut b, GuestAddress(a)).is_err() {
                        break;
                    }
                    let tag = u16::from_le_bytes([b[0], b[1]]);
                    let mut v = [0u8; 8];
                    v.copy_from_slice(&b[2..]);
                    out.push((tag, u64::from_le_bytes(v)));
                }
            }
            // A second buffer while we hold one: give the old one back.
            if let Some(old) = self.stats_head.replace(head) {
                let _ = q.add_used(mem, old, 0);
            }
            self.handle.store_stats(out);
        }
        let _ = q.enable_notification(mem);
    }

    /// Hands the stats buffer back so the driver refills it.
    fn ask_stats(&mut self) {
        let mem = &*self.mem;
        let Some((idx, q)) = self.stats.as_mut() else {
            return;
        };
        if let Some(head) = self.stats_head.take() {
            if q.add_used(mem, head, 0).is_ok() {
                self.stats_asked = Some(Instant::now());
                self.irq.queue(*idx);
            }
        }
    }

    fn wake(&mut self) {
        let t = self.handle.target.load(Ordering::SeqCst);
        if t != self.last_target {
            self.last_target = t;
            self.irq.config();
        }
        self.ask_stats();
    }

    fn run(mut self, events: Vec<(usize, EventFd)>, kill: EventFd) {
        let Ok(mut poller) = Poller::new() else {
            return;
        };
        const T_KILL: u64 = 100;
        const T_WAKE: u64 = 101;
        let mut ok = poller.add(&kill, T_KILL).is_ok();
        ok &= poller.add(&self.handle.wake, T_WAKE).is_ok();
        for (i, e) in &events {
            ok &= poller.add(e, *i as u64).is_ok();
        }
        if !ok {
            return crate::warn("balloon", format_args!("epoll set-up failed"));
        }
        // Linux queues its first stats buffer (and may queue more) before
        // DRIVER_OK, when its kick reaches no one: look at every queue once.
        self.stats_arrived();
        self.inflate();
        self.deflate();
        self.report();
        // The target may have been set before the driver came up.
        self.wake();
        loop {
            let Ok(tokens) = poller.wait(1000) else {
                return;
            };
            for t in tokens {
                match t {
                    T_KILL => return,
                    T_WAKE => {
                        let _ = self.handle.wake.read();
                        self.wake();
                    }
                    i => {
                        if let Some((_, e)) = events.iter().find(|(q, _)| *q as u64 == i) {
                            let _ = e.read();
                        }
                        match i as usize {
                            Q_INFLATE => self.inflate(),
                            Q_DEFLATE => self.deflate(),
                            q if self.stats.as_ref().is_some_and(|s| s.0 == q) => {
                                self.stats_arrived()
                            }
                            q if self.reporting.as_ref().is_some_and(|s| s.0 == q) => self.report(),
                            _ => {}
                        }
                    }
                }
            }
            let stale = self
                .handle
                .stats
                .lock()
                .unwrap_or_else(|e| e.into_inner())
                .1
                .is_none_or(|t| t.elapsed() >= STATS_PERIOD);
            if stale && self.stats_asked.is_none_or(|t| t.elapsed() >= STATS_PERIOD) {
                self.ask_stats();
            }
        }
    }
}

impl VirtioDevice for Balloon {
    fn device_type(&self) -> u32 {
        crate::TYPE_BALLOON
    }

    /// inflate, deflate, stats, reporting (the free page hint queue is not
    /// offered, so reporting follows stats).
    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE; 4]
    }

    fn features(&self) -> u64 {
        // Not DEFLATE_ON_OOM: a balloon the host sets is the guest's new size
        // (its MemTotal shrinks), as with Xen's mem-set.
        crate::BASE_FEATURES | F_STATS_VQ | F_REPORTING
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        let mut c = [0u8; 16];
        c[0..4].copy_from_slice(&self.handle.target.load(Ordering::SeqCst).to_le_bytes());
        c[4..8].copy_from_slice(&self.handle.actual.load(Ordering::SeqCst).to_le_bytes());
        crate::read_config_bytes(&c, offset, data);
    }

    fn state(&self) -> crate::DeviceState {
        crate::DeviceState::Balloon {
            target_pages: self.handle.target_pages(),
            actual_pages: self.handle.actual_pages(),
        }
    }

    fn restore(&mut self, s: &crate::DeviceState) -> Result<(), String> {
        let crate::DeviceState::Balloon {
            target_pages,
            actual_pages,
        } = s
        else {
            return Err("the snapshot holds no balloon state for the balloon".into());
        };
        self.handle.set_target_pages(*target_pages);
        let actual = u32::try_from(*actual_pages).map_err(|_| "balloon: actual too large")?;
        self.handle.actual.store(actual, Ordering::SeqCst);
        Ok(())
    }

    fn write_config(&mut self, offset: u64, data: &[u8]) {
        // Only `actual` (bytes 4..8) is the driver's to write.
        let mut b = self.handle.actual.load(Ordering::SeqCst).to_le_bytes();
        for (i, v) in data.iter().enumerate() {
            let Some(o) = offset.checked_add(i as u64) else {
                return;
            };
            if (4..8).contains(&o) {
                b[(o - 4) as usize] = *v;
            }
        }
        self.handle
            .actual
            .store(u32::from_le_bytes(b), Ordering::SeqCst);
    }

    fn activate(&mut self, a: Activation) -> Result<(), ActivateError> {
        let stats_idx = (a.features & F_STATS_VQ != 0).then_some(2);
        let rep_idx = (a.features & F_REPORTING != 0).then_some(2 + stats_idx.is_some() as usize);
        let mut e = Engine {
            mem: a.mem,
            handle: self.handle.clone(),
            irq: a.interrupt,
            inflate: None,
            deflate: None,
            stats: None,
            reporting: None,
            stats_head: None,
            stats_asked: None,
            last_target: u32::MAX,
        };
        let mut events = Vec::new();
        for q in a.queues {
            match q.index {
                Q_INFLATE => e.inflate = Some(q.queue),
                Q_DEFLATE => e.deflate = Some(q.queue),
                i if Some(i) == stats_idx => e.stats = Some((i, q.queue)),
                i if Some(i) == rep_idx => e.reporting = Some((i, q.queue)),
                _ => continue,
            }
            events.push((q.index, q.event));
        }
        if e.inflate.is_none() {
            return Err(ActivateError::MissingQueue(Q_INFLATE));
        }
        if e.deflate.is_none() {
            return Err(ActivateError::MissingQueue(Q_DEFLATE));
        }
        self.running = Some(DeviceThread::spawn(
            "virtio-balloon",
            256 << 10,
            move |kill| e.run(events, kill),
        )?);
        Ok(())
    }

    fn reset(&mut self) {
        if let Some(t) = self.running.take() {
            t.stop();
        }
        self.handle.actual.store(0, Ordering::SeqCst);
    }
}

impl Drop for Balloon {
    fn drop(&mut self) {
        self.reset();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use vm_memory::GuestMemoryMmap;

    fn mem() -> Memory {
        GuestMemoryMmap::from_ranges(&[(GuestAddress(0), 1 << 20)]).unwrap()
    }

    #[test]
    fn discard_zeroes_whole_pages_inside_ram_only() {
        let m = mem();
        m.write_slice(&[7u8; 3 * 4096], GuestAddress(0x1000))
            .unwrap();
        let dirty = || crate::take_dirty(&m)[0][0];
        dirty();
        // Cut inwards: only the page at 0x2000 is whole inside the range,
        // and only it is marked changed (for a migration).
        assert!(discard(&m, 0x1800, 0x2000));
        assert_eq!(dirty(), 1 << 2);
        let mut b = [0u8; 3 * 4096];
        m.read_slice(&mut b, GuestAddress(0x1000)).unwrap();
        assert!(b[..4096].iter().all(|x| *x == 7));
        assert!(b[4096..8192].iter().all(|x| *x == 0));
        assert!(b[8192..].iter().all(|x| *x == 7));
        assert!(!discard(&m, 1 << 20, 4096), "outside RAM");
        assert!(!discard(&m, (1 << 20) - 4096, 8192), "straddles the end");
        assert!(!discard(&m, u64::MAX - 10, 100), "wraps");
        assert!(discard(&m, 0x10, 0), "empty");
    }

    #[test]
    fn page_numbers_group_into_runs() {
        let m = mem();
        let pfns: [u32; 6] = [5, 6, 7, 9, 3, 4];
        for (i, p) in pfns.iter().enumerate() {
            m.write_obj(*p, GuestAddress(0x100 + i as u64 * 4)).unwrap();
        }
        let mut runs = Vec::new();
        pfn_runs(&m, 0x100, 24 + 3, |s, c| runs.push((s, c)));
        assert_eq!(runs, vec![(5, 3), (9, 1), (3, 2)]);
        runs.clear();
        pfn_runs(&m, (1 << 20) - 8, 64, |s, c| runs.push((s, c)));
        let pages: u64 = runs.iter().map(|r| r.1).sum();
        assert_eq!(pages, 2, "stops at the end of RAM");
    }

    #[test]
    fn config_has_target_and_actual_and_only_actual_is_writable() {
        let mut b = Balloon::new().unwrap();
        b.handle.set_target_pages(0x1234);
        b.write_config(0, &[0xff; 16]);
        let mut c = [0u8; 8];
        b.read_config(0, &mut c);
        assert_eq!(u32::from_le_bytes(c[0..4].try_into().unwrap()), 0x1234);
        assert_eq!(u32::from_le_bytes(c[4..8].try_into().unwrap()), u32::MAX);
        b.write_config(5, &[0]);
        assert_eq!(b.handle.actual_pages(), 0xffff00ff);
        b.write_config(u64::MAX, &[1, 2]);
        assert_eq!(b.handle.actual_pages(), 0xffff00ff);
        b.handle.set_target_pages(u64::MAX);
        assert_eq!(b.handle.target_pages(), u64::from(u32::MAX));
    }

    #[test]
    fn stat_names_cover_the_spec() {
        assert_eq!(stat_name(4), Some("free_memory"));
        assert_eq!(stat_name(15), Some("direct_reclaims"));
        assert_eq!(stat_name(99), None);
    }
}
