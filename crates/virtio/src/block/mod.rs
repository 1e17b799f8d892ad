//! virtio-blk (type 2) on a raw image file or a qcow2 image (with its
//! backing chain, opened by `domus-disk`).
//!
//! The device thread pops requests, parses them (`request`), applies the
//! rate limiter and hands them to a pool of I/O threads (`io`), which
//! complete them in whatever order the host finishes them; the device
//! thread then puts them in the used ring by descriptor id and interrupts
//! the guest (subject to `VIRTIO_RING_F_EVENT_IDX`).
//!
//! Supported: read, write, flush (fdatasync before the completion; for
//! qcow2, imago's metadata first), GET_ID, discard and write-zeroes (hole
//! punching; discarded qcow2 clusters read as zeroes, not the backing
//! file), read-only disks (`VIRTIO_BLK_F_RO`, the file opened read-only,
//! writes fail with IOERR).

pub mod io;
pub mod request;

use std::os::fd::AsRawFd;
use std::path::{Path, PathBuf};
use std::sync::mpsc::{channel, Receiver, Sender};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::Duration;

use domus_devices::bus::lock;
use virtio_queue::{Queue, QueueT};
use vm_memory::Bytes;
use vmm_sys_util::eventfd::EventFd;
use vmm_sys_util::timerfd::TimerFd;

use crate::epoll::Poller;
use crate::ratelimit::{Limits, Shared};
use crate::{ActivateError, Activation, DeviceThread, Interrupt, Memory, VirtioDevice};
use domus_disk::{ByPath, Format, Opener, Qcow2Image};
pub use io::Counters;
use io::{Backend, Disk};
use request::{Desc, Request, ID_BYTES, SECTOR_SIZE};

const QUEUE_SIZE: u16 = 256;
/// Data segments one request may carry (the config's `seg_max`): a 1 MiB
/// write of scattered 4 KiB guest pages (256 segments) arrives whole, where
/// `QUEUE_SIZE - 2` made Linux split it in two (1016 KiB and 8 KiB) that
/// the I/O threads run at once, on a fresh qcow2 overlay both allocating
/// in the same cluster, one waiting for the other. Beyond the ring's size
/// only through indirect descriptors, which Linux negotiates (a driver
/// without them cannot make a chain longer than the ring); at most
/// `IOV_MAX` (1024): imago hands a request's buffers to one
/// preadv/pwritev, so on a qcow2 disk a longer chain (only a hostile
/// guest's) fails with an I/O error.
const SEG_MAX: u32 = 1024;
/// I/O threads per disk.
const IO_THREADS: usize = 4;

use virtio_bindings::virtio_blk as vb;

const F_SEG_MAX: u64 = 1 << vb::VIRTIO_BLK_F_SEG_MAX;
const F_RO: u64 = 1 << vb::VIRTIO_BLK_F_RO;
const F_BLK_SIZE: u64 = 1 << vb::VIRTIO_BLK_F_BLK_SIZE;
const F_FLUSH: u64 = 1 << vb::VIRTIO_BLK_F_FLUSH;
const F_DISCARD: u64 = 1 << vb::VIRTIO_BLK_F_DISCARD;
const F_WRITE_ZEROES: u64 = 1 << vb::VIRTIO_BLK_F_WRITE_ZEROES;

/// How the user asked for a disk (`--disk PATH[,ro][,id=NAME]...`).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DiskConfig {
    pub path: PathBuf,
    pub format: Format,
    pub read_only: bool,
    pub id: Option<String>,
    pub limits: Limits,
    /// The tag of a descriptor the supervisor passed for `path` (a jailed
    /// VMM cannot open it): see [`Block::open_with`].
    pub passed: Option<u64>,
    /// The tags of the descriptors passed for a qcow2 disk's backing files,
    /// in chain order.
    pub passed_backing: Vec<u64>,
}

#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("disk {path}: {reason}")]
    Open { path: String, reason: String },
    #[error("disk {0}")]
    Image(#[from] domus_disk::Error),
    #[error("disk {path}: is in use by another domain (locked)")]
    Locked { path: String },
    #[error("disk {path}: is empty (a disk needs at least one 512-byte sector)")]
    Empty { path: String },
}

pub struct Block {
    disk: Arc<Disk>,
    capacity: u64,
    limiter: Arc<Shared>,
    running: Option<DeviceThread>,
}

/// The GET_ID string: the configured id, else the file name, cut to 20 bytes.
fn disk_id(path: &Path, id: Option<&str>) -> [u8; ID_BYTES] {
    let name = id.map(str::to_owned).unwrap_or_else(|| {
        path.file_name()
            .map(|n| n.to_string_lossy().into_owned())
            .unwrap_or_default()
    });
    let mut b = [0u8; ID_BYTES];
    let n = name.len().min(ID_BYTES);
    b[..n].copy_from_slice(&name.as_bytes()[..n]);
    b
}

/// Locks one file of a disk: shared if read-only, else exclusive; false if
/// another process holds a lock that conflicts.
fn lock_image(file: &std::fs::File, read_only: bool) -> bool {
    let op = if read_only {
        libc::LOCK_SH
    } else {
        libc::LOCK_EX
    };
    // SAFETY: flock on a descriptor we own; no memory is involved.
    unsafe { libc::flock(file.as_raw_fd(), op | libc::LOCK_NB) == 0 }
}

impl Block {
    /// Opens the image (read-only if asked) with its backing chain and
    /// locks it: the disk shared for read-only disks and exclusive
    /// otherwise, so two domains never write one image; backing files
    /// shared, so nobody writes a base while overlays read it.
    pub fn open(cfg: &DiskConfig) -> Result<Self, OpenError> {
        Self::open_with(cfg, &mut ByPath)
    }

    /// The disk, its files opened through `opener` (a jailed VMM takes the
    /// descriptors it was passed), locked as [`Block::open`] does.
    pub fn open_with(cfg: &DiskConfig, opener: &mut dyn Opener) -> Result<Self, OpenError> {
        let path = cfg.path.display().to_string();
        let chain = domus_disk::open(&cfg.path, cfg.format, !cfg.read_only, opener)?;
        let locks: Vec<(std::fs::File, bool)> = chain
            .links
            .into_iter()
            .map(|l| (l.file, !l.write))
            .collect();
        for (i, (f, shared)) in locks.iter().enumerate() {
            if !lock_image(f, *shared) {
                let path = if i == 0 {
                    path
                } else {
                    format!("{path}'s backing file (link {i} of its chain)")
                };
                return Err(OpenError::Locked { path });
            }
        }
        let capacity = chain.size / SECTOR_SIZE;
        if capacity == 0 {
            return Err(OpenError::Empty { path });
        }
        let backend = match chain.image {
            None => {
                let f = locks[0].0.try_clone().map_err(|e| OpenError::Open {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
                Backend::Raw(f)
            }
            Some(i) => Backend::Qcow2(Qcow2Image::new(i, &locks[0].0)),
        };
        Ok(Self {
            disk: Arc::new(Disk {
                backend,
                locks,
                read_only: cfg.read_only,
                id: disk_id(&cfg.path, cfg.id.as_deref()),
                counters: Counters::default(),
            }),
            capacity,
            limiter: Arc::new(Shared::new(cfg.limits).map_err(|e| OpenError::Open {
                path: path.clone(),
                reason: e.to_string(),
            })?),
            running: None,
        })
    }

    /// Capacity in 512-byte sectors.
    pub fn capacity(&self) -> u64 {
        self.capacity
    }

    /// The disk's counters and its rate limiter, for the API.
    pub fn handles(&self) -> (Arc<Disk>, Arc<Shared>) {
        (self.disk.clone(), self.limiter.clone())
    }

    fn config_bytes(&self) -> [u8; 60] {
        let mut c = [0u8; 60];
        c[0..8].copy_from_slice(&self.capacity.to_le_bytes());
        c[12..16].copy_from_slice(&SEG_MAX.to_le_bytes()); // seg_max
        c[20..24].copy_from_slice(&512u32.to_le_bytes()); // blk_size
        let max_sectors = u32::MAX / 512;
        c[36..40].copy_from_slice(&max_sectors.to_le_bytes()); // max_discard_sectors
        c[40..44].copy_from_slice(&request::MAX_SEGMENTS.to_le_bytes());
        c[44..48].copy_from_slice(&8u32.to_le_bytes()); // discard alignment: 4 KiB
        c[48..52].copy_from_slice(&max_sectors.to_le_bytes()); // max_write_zeroes_sectors
        c[52..56].copy_from_slice(&request::MAX_SEGMENTS.to_le_bytes());
        c[56] = 1; // write_zeroes_may_unmap
        c
    }
}

impl VirtioDevice for Block {
    fn device_type(&self) -> u32 {
        crate::TYPE_BLOCK
    }

    fn pci_class(&self) -> u32 {
        0x01_8000 << 8 // mass storage, other
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE]
    }

    fn features(&self) -> u64 {
        let mut f = crate::BASE_FEATURES | F_SEG_MAX | F_BLK_SIZE | F_FLUSH;
        if self.disk.read_only {
            f |= F_RO;
        } else {
            f |= F_DISCARD | F_WRITE_ZEROES;
        }
        f
    }

    fn read_config(&self, offset: u64, data: &mut [u8]) {
        crate::read_config_bytes(&self.config_bytes(), offset, data);
    }

    fn activate(&mut self, a: Activation) -> Result<(), ActivateError> {
        let q = a
            .queues
            .into_iter()
            .find(|q| q.index == 0)
            .ok_or(ActivateError::MissingQueue(0))?;
        let done_evt = EventFd::new(libc::EFD_NONBLOCK)?;
        let (job_tx, job_rx) = channel::<Job>();
        let (done_tx, done_rx) = channel::<Done>();
        let job_rx = Arc::new(Mutex::new(job_rx));
        let mut workers = Vec::new();
        for i in 0..IO_THREADS {
            let (rx, tx) = (job_rx.clone(), done_tx.clone());
            let (disk, mem) = (self.disk.clone(), a.mem.clone());
            let evt = done_evt.try_clone()?;
            // imago's allocator recurses (a refcount block for a refcount
            // block...): qcow2's I/O threads get more stack than raw's.
            let stack = match self.disk.backend {
                Backend::Raw(_) => 256 << 10,
                Backend::Qcow2(_) => 2 << 20,
            };
            workers.push(
                crate::spawn_thread(format!("blk-io{i}"), stack, move || {
                    io_worker(&disk, &mem, &rx, &tx, &evt)
                })
                .map_err(ActivateError::Thread)?,
            );
        }
        let engine = Engine {
            mem: a.mem,
            queue: q.queue,
            irq: a.interrupt,
            disk: self.disk.clone(),
            capacity: self.capacity,
            limiter: self.limiter.clone(),
            jobs: Some(job_tx),
            done_rx,
            pending: None,
            workers,
        };
        let qevt = q.event;
        self.running = Some(DeviceThread::spawn("virtio-blk", 256 << 10, move |kill| {
            engine.run(qevt, kill, done_evt)
        })?);
        Ok(())
    }

    fn reset(&mut self) {
        if let Some(t) = self.running.take() {
            t.stop();
        }
    }

    fn release_host(&mut self) {
        for (f, _) in &self.disk.locks {
            // SAFETY: flock on a descriptor we own; no memory is involved.
            unsafe { libc::flock(f.as_raw_fd(), libc::LOCK_UN) };
        }
    }

    fn reclaim_host(&mut self) -> Result<(), String> {
        if self
            .disk
            .locks
            .iter()
            .all(|(f, shared)| lock_image(f, *shared))
        {
            Ok(())
        } else {
            Err("its image is locked by another process now".into())
        }
    }
}

impl Drop for Block {
    fn drop(&mut self) {
        self.reset();
    }
}

struct Job {
    head: u16,
    req: Request,
}

struct Done {
    head: u16,
    len: u32,
}

fn io_worker(
    disk: &Disk,
    mem: &Memory,
    jobs: &Mutex<Receiver<Job>>,
    done: &Sender<Done>,
    evt: &EventFd,
) {
    loop {
        let job = match lock(jobs).recv() {
            Ok(j) => j,
            Err(_) => return, // the engine is gone
        };
        let status = io::execute(disk, mem, &job.req);
        let len = if status == request::S_OK {
            job.req.used_len()
        } else {
            1
        };
        // The status address was checked by the parser.
        let _ = mem.write_obj(status, job.req.status);
        if done
            .send(Done {
                head: job.head,
                len,
            })
            .is_err()
        {
            return;
        }
        let _ = evt.write(1);
    }
}

struct Engine {
    mem: Arc<Memory>,
    queue: Queue,
    irq: Interrupt,
    disk: Arc<Disk>,
    capacity: u64,
    limiter: Arc<Shared>,
    jobs: Option<Sender<Job>>,
    done_rx: Receiver<Done>,
    pending: Option<Job>,
    workers: Vec<JoinHandle<()>>,
}

const T_QUEUE: u64 = 0;
const T_KILL: u64 = 1;
const T_DONE: u64 = 2;
const T_TIMER: u64 = 3;
const T_LIMITS: u64 = 4;

impl Engine {
    fn run(mut self, qevt: EventFd, kill: EventFd, done_evt: EventFd) {
        let mut timer = match TimerFd::new() {
            Ok(t) => t,
            Err(e) => return crate::warn("virtio-blk", format_args!("timerfd: {e}")),
        };
        let mut poller = match Poller::new() {
            Ok(p) => p,
            Err(e) => return crate::warn("virtio-blk", format_args!("epoll: {e}")),
        };
        let added = poller
            .add(&qevt, T_QUEUE)
            .and(poller.add(&kill, T_KILL))
            .and(poller.add(&done_evt, T_DONE))
            .and(poller.add(&timer, T_TIMER))
            .and(poller.add(&self.limiter.changed, T_LIMITS));
        if let Err(e) = added {
            return crate::warn("virtio-blk", format_args!("epoll: {e}"));
        }
        'outer: while let Ok(tokens) = poller.wait(-1) {
            for t in tokens {
                match t {
                    T_KILL => break 'outer,
                    T_QUEUE => {
                        let _ = qevt.read();
                        self.process_queue(&mut timer);
                    }
                    T_DONE => {
                        let _ = done_evt.read();
                        self.complete();
                    }
                    T_TIMER => {
                        let _ = timer.wait();
                        self.process_queue(&mut timer);
                    }
                    T_LIMITS => {
                        let _ = self.limiter.changed.read();
                        self.process_queue(&mut timer);
                    }
                    _ => {}
                }
            }
        }
        // Let in-flight I/O finish before the guest's memory is reused, and
        // complete every request taken from the queue (a throttled one
        // too): a device stopped for a snapshot resumes at the used ring's
        // index, so nothing taken may be left out of it.
        if let (Some(job), Some(tx)) = (self.pending.take(), &self.jobs) {
            let _ = tx.send(job);
        }
        self.jobs = None;
        for w in self.workers.drain(..) {
            let _ = w.join();
        }
        self.complete();
    }

    /// Hands a request to the I/O threads if the limiter allows; else
    /// keeps it and arms the timer. Returns false when throttled.
    fn submit(&mut self, job: Job, timer: &mut TimerFd) -> bool {
        let r = self.limiter.consume(job.req.bytes());
        match r {
            Ok(()) => {
                if let Some(tx) = &self.jobs {
                    let _ = tx.send(job);
                }
                true
            }
            Err(wait) => {
                self.disk
                    .counters
                    .throttled
                    .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                self.pending = Some(job);
                let _ = timer.reset(wait.max(Duration::from_micros(50)), None);
                false
            }
        }
    }

    fn process_queue(&mut self, timer: &mut TimerFd) {
        if let Some(job) = self.pending.take() {
            if !self.submit(job, timer) {
                return;
            }
        }
        let mem = self.mem.clone();
        let mut answered = false;
        loop {
            if self.queue.disable_notification(&*mem).is_err() {
                break;
            }
            while let Some(chain) = self.queue.pop_descriptor_chain(&*mem) {
                let head = chain.head_index();
                let descs: Vec<Desc> = chain
                    .map(|d| Desc {
                        addr: d.addr().0,
                        len: d.len(),
                        write: d.is_write_only(),
                    })
                    .collect();
                match request::parse(&*mem, &descs, self.capacity) {
                    Ok(req) => {
                        if !self.submit(Job { head, req }, timer) {
                            if answered {
                                self.notify();
                            }
                            return;
                        }
                    }
                    Err(rej) => {
                        self.disk
                            .counters
                            .errors
                            .fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                        let len = match rej.status {
                            Some(at) => {
                                let _ = mem.write_obj(rej.error.status(), at);
                                1
                            }
                            None => 0,
                        };
                        let _ = self.queue.add_used(&*mem, head, len);
                        answered = true;
                    }
                }
            }
            match self.queue.enable_notification(&*mem) {
                Ok(true) if !crate::ring_corrupt(&self.queue, &mem) => continue,
                _ => break,
            }
        }
        if answered {
            self.notify();
        }
    }

    fn notify(&mut self) {
        if self.queue.needs_notification(&*self.mem).unwrap_or(true) {
            self.irq.queue(0);
        }
    }

    fn complete(&mut self) {
        let mut any = false;
        while let Ok(d) = self.done_rx.try_recv() {
            if self.queue.add_used(&*self.mem, d.head, d.len).is_err() {
                crate::warn("virtio-blk", format_args!("used ring not writable"));
            }
            any = true;
        }
        if any {
            self.notify();
        }
    }
}
