//! virtio-rng (entropy device, type 4): one queue whose device-writable
//! buffers are filled from the host's `getrandom(2)`.

use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;

use virtio_queue::{Queue, QueueT};
use vm_memory::{Bytes, GuestAddress};
use vmm_sys_util::eventfd::EventFd;

use crate::epoll::Poller;
use crate::{ActivateError, Activation, DeviceThread, Interrupt, Memory, VirtioDevice};

const QUEUE_SIZE: u16 = 256;
/// The most bytes one request gets; a guest asking for more gets this much.
pub const MAX_REQUEST: usize = 64 << 10;

pub struct Rng {
    running: Option<DeviceThread>,
    counters: Arc<Counters>,
}

/// Requests served and bytes handed to the guest.
#[derive(Debug, Default)]
pub struct Counters {
    pub requests: AtomicU64,
    pub bytes: AtomicU64,
}

impl crate::Stats for Counters {
    fn counters(&self) -> Vec<(&'static str, u64)> {
        vec![
            ("requests", self.requests.load(Ordering::Relaxed)),
            ("bytes", self.bytes.load(Ordering::Relaxed)),
        ]
    }
}

impl Default for Rng {
    fn default() -> Self {
        Self::new()
    }
}

impl Rng {
    pub fn new() -> Self {
        Self {
            running: None,
            counters: Arc::default(),
        }
    }

    pub fn counters(&self) -> Arc<Counters> {
        self.counters.clone()
    }
}

/// Fills `buf` from getrandom.
fn fill_random(buf: &mut [u8]) -> std::io::Result<()> {
    let mut done = 0;
    while done < buf.len() {
        let rest = &mut buf[done..];
        // SAFETY: the pointer and length describe `rest`, a live, writable
        // slice; getrandom writes at most that many bytes.
        let n = unsafe { libc::getrandom(rest.as_mut_ptr().cast(), rest.len(), 0) };
        if n < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                continue;
            }
            return Err(e);
        }
        done += n as usize;
    }
    Ok(())
}

/// Serves every available request on `queue`; returns whether the guest
/// must be interrupted. Hostile chains end the chain early, never the VMM.
pub fn process(mem: &Memory, queue: &mut Queue, counters: &Counters) -> bool {
    let mut used_any = false;
    loop {
        if queue.disable_notification(mem).is_err() {
            return used_any;
        }
        while let Some(chain) = queue.pop_descriptor_chain(mem) {
            let head = chain.head_index();
            let mut written = 0usize;
            let mut buf = Vec::new();
            for d in chain.writable() {
                let want = (d.len() as usize).min(MAX_REQUEST - written);
                if want == 0 {
                    break;
                }
                buf.resize(want, 0);
                if fill_random(&mut buf).is_err()
                    || mem.write_slice(&buf, GuestAddress(d.addr().0)).is_err()
                {
                    break;
                }
                written += want;
            }
            if queue.add_used(mem, head, written as u32).is_err() {
                return used_any;
            }
            counters.requests.fetch_add(1, Ordering::Relaxed);
            counters.bytes.fetch_add(written as u64, Ordering::Relaxed);
            used_any = true;
        }
        match queue.enable_notification(mem) {
            Ok(true) if !crate::ring_corrupt(queue, mem) => continue,
            _ => break,
        }
    }
    used_any && queue.needs_notification(mem).unwrap_or(true)
}

fn run(
    mem: Arc<Memory>,
    mut queue: Queue,
    event: EventFd,
    kill: EventFd,
    irq: Interrupt,
    counters: Arc<Counters>,
) {
    let mut poller = match Poller::new() {
        Ok(p) => p,
        Err(e) => return crate::warn("rng", format_args!("epoll: {e}")),
    };
    if poller.add(&event, 0).and(poller.add(&kill, 1)).is_err() {
        return;
    }
    loop {
        let Ok(tokens) = poller.wait(-1) else { return };
        for t in tokens {
            if t == 1 {
                return;
            }
            let _ = event.read();
            if process(&mem, &mut queue, &counters) {
                irq.queue(0);
            }
        }
    }
}

impl VirtioDevice for Rng {
    fn device_type(&self) -> u32 {
        crate::TYPE_RNG
    }

    fn queue_max_sizes(&self) -> Vec<u16> {
        vec![QUEUE_SIZE]
    }

    fn features(&self) -> u64 {
        crate::BASE_FEATURES
    }

    fn read_config(&self, _offset: u64, data: &mut [u8]) {
        data.fill(0);
    }

    fn activate(&mut self, a: Activation) -> Result<(), ActivateError> {
        let q = a
            .queues
            .into_iter()
            .find(|q| q.index == 0)
            .ok_or(ActivateError::MissingQueue(0))?;
        let (mem, irq, c) = (a.mem, a.interrupt, self.counters.clone());
        self.running = Some(DeviceThread::spawn("virtio-rng", 256 << 10, move |kill| {
            run(mem, q.queue, q.event, kill, irq, c)
        })?);
        Ok(())
    }

    fn reset(&mut self) {
        if let Some(t) = self.running.take() {
            t.stop();
        }
    }
}

impl Drop for Rng {
    fn drop(&mut self) {
        self.reset();
    }
}
