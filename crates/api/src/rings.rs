//! `GET /v1/domain/rings`: each virtio queue as the guest's rings show it,
//! with the device's last interrupt for it and the state of its MSI-X
//! vector, and what that says about a guest that has stopped moving.
//!
//! A guest that waits for a device and a device that waits for the guest
//! look alike from outside (every vCPU halted, nothing happening). The
//! rings tell them apart: with `VIRTIO_RING_F_EVENT_IDX` the driver writes
//! the used index after which it wants an interrupt (`used_event`), and the
//! device records the used index at each interrupt it sends. A used index
//! past `used_event` with no interrupt sent since is the device's fault; one
//! with an interrupt sent, on an unmasked vector routed as the guest
//! programmed it, is an interrupt the guest never handled.

use serde::{Deserialize, Serialize};

/// One queue of one device.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct RingInfo {
    /// The device's id (`net0`, `vda`, ...).
    pub device: String,
    pub queue: u16,
    pub size: u16,
    /// Whether the driver took `VIRTIO_RING_F_EVENT_IDX`.
    pub event_idx: bool,
    /// The available ring's index, flags and `used_event` (read from guest
    /// memory; the driver writes them).
    pub avail_idx: u16,
    pub avail_flags: u16,
    pub used_event: u16,
    /// The used ring's index, flags and `avail_event` (the device writes
    /// them).
    pub used_idx: u16,
    pub used_flags: u16,
    pub avail_event: u16,
    /// The used index when the device last interrupted the guest for this
    /// queue; `None` if it has not since the driver started it, or if a
    /// kernel backend (vhost) signals for it.
    pub signalled_at: Option<u16>,
    /// The queue's MSI-X vector; `None` when the driver gave it none.
    pub vector: Option<VectorInfo>,
}

/// An MSI-X vector as the device sees it.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct VectorInfo {
    pub index: u16,
    /// MSI-X enabled on the function and the function not masked.
    pub enabled: bool,
    pub masked: bool,
    /// An interrupt waits for the vector to be unmasked.
    pub pending: bool,
    /// Interrupts sent on it since the VMM started.
    pub fired: u64,
    /// The route KVM has for it is the message in the guest's table.
    pub routed: bool,
}

/// What a queue's state says, when it says something; written as
/// `{"kind": "owed" | "not_handled", "text": ...}` (what `tools/soak.py
/// capture --rings` reads).
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", content = "text", rename_all = "snake_case")]
pub enum RingFinding {
    /// The used index passed the driver's event index and the device sent
    /// no interrupt after it did: the device owes the guest one.
    Owed(String),
    /// The device sent the interrupt the driver asked for, on a vector
    /// that can deliver it, and the driver has not handled it.
    NotHandled(String),
}

/// `x` is after `event` in the ring's wrapping index space (the virtio
/// spec's `vring_need_event` test, for one step).
fn passed(x: u16, event: u16) -> bool {
    x.wrapping_sub(event).wrapping_sub(1) < 0x8000
}

impl RingInfo {
    fn name(&self) -> String {
        format!("{} queue {}", self.device, self.queue)
    }

    /// What this queue's state says about a stalled guest, if anything.
    /// Only meaningful when the state has held still (read it twice).
    pub fn finding(&self) -> Option<RingFinding> {
        // Without event indexes the driver's wishes are a flag the device
        // may ignore; and Linux writes used_event 0 to mean "callbacks off"
        // while it polls (virtqueue_disable_cb).
        if !self.event_idx || self.used_event == 0 || !passed(self.used_idx, self.used_event) {
            return None;
        }
        let (u, e) = (self.used_idx, self.used_event);
        let s = self.signalled_at?;
        if !passed(s, e) {
            return Some(RingFinding::Owed(format!(
                "{}: used index {u} is past the driver's event index {e}, and the device's last interrupt was at {s}",
                self.name()
            )));
        }
        let v = self.vector.as_ref()?;
        if v.enabled && !v.masked && !v.pending && v.routed && v.fired > 0 {
            return Some(RingFinding::NotHandled(format!(
                "{}: interrupt sent at used index {s} on vector {} (unmasked, routed, {} sent in all), the driver asked for one past {e} and has not handled it",
                self.name(),
                v.index,
                v.fired
            )));
        }
        None
    }
}

/// The findings that two readings taken a moment apart agree on: a queue
/// whose state moved between them is at work, not stalled.
pub fn stable_findings(first: &[RingInfo], second: &[RingInfo]) -> Vec<RingFinding> {
    second
        .iter()
        .filter(|r| first.contains(r))
        .filter_map(RingInfo::finding)
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ring(used_idx: u16, used_event: u16, signalled_at: Option<u16>) -> RingInfo {
        RingInfo {
            device: "net0".into(),
            queue: 1,
            size: 256,
            event_idx: true,
            avail_idx: 300,
            avail_flags: 0,
            used_event,
            used_idx,
            used_flags: 0,
            avail_event: 300,
            signalled_at,
            vector: Some(VectorInfo {
                index: 2,
                enabled: true,
                masked: false,
                pending: false,
                fired: 7,
                routed: true,
            }),
        }
    }

    #[test]
    fn a_driver_that_is_up_to_date_says_nothing() {
        assert_eq!(ring(100, 100, Some(100)).finding(), None);
        // Waiting for the next one, not yet there.
        assert_eq!(ring(100, 101, Some(90)).finding(), None);
    }

    #[test]
    fn an_interrupt_not_sent_is_owed() {
        let f = ring(105, 100, Some(100)).finding();
        assert!(matches!(f, Some(RingFinding::Owed(_))), "{f:?}");
        // Across the wrap.
        let f = ring(3, 65534, Some(65530)).finding();
        assert!(matches!(f, Some(RingFinding::Owed(_))), "{f:?}");
    }

    #[test]
    fn an_interrupt_sent_and_not_handled_is_the_guests() {
        let f = ring(105, 100, Some(105)).finding();
        assert!(matches!(f, Some(RingFinding::NotHandled(_))), "{f:?}");
        let f = ring(2, 65535, Some(1)).finding();
        assert!(matches!(f, Some(RingFinding::NotHandled(_))), "{f:?}");
    }

    #[test]
    fn a_vector_that_cannot_deliver_or_a_driver_polling_says_nothing() {
        let mut r = ring(105, 100, Some(105));
        r.vector.as_mut().unwrap().masked = true;
        assert_eq!(r.finding(), None);
        let mut r = ring(105, 100, Some(105));
        r.vector = None;
        assert_eq!(r.finding(), None);
        // used_event 0: callbacks off while the driver polls.
        assert_eq!(ring(105, 0, Some(3)).finding(), None);
        let mut r = ring(105, 100, Some(100));
        r.event_idx = false;
        assert_eq!(r.finding(), None);
        // vhost signals for the queue itself.
        assert_eq!(ring(105, 100, None).finding(), None);
    }

    #[test]
    fn findings_are_written_as_soak_py_reads_them() {
        let f = ring(105, 100, Some(100)).finding().unwrap();
        let v = serde_json::to_value(&f).unwrap();
        assert_eq!(v["kind"], "owed");
        assert!(v["text"].as_str().unwrap().starts_with("net0 queue 1: "));
        let f = ring(105, 100, Some(105)).finding().unwrap();
        assert_eq!(serde_json::to_value(&f).unwrap()["kind"], "not_handled");
    }

    #[test]
    fn only_a_state_that_held_still_counts() {
        let a = ring(105, 100, Some(100));
        let moved = ring(106, 100, Some(100));
        assert!(stable_findings(std::slice::from_ref(&a), &[moved]).is_empty());
        assert_eq!(
            stable_findings(std::slice::from_ref(&a), std::slice::from_ref(&a)).len(),
            1
        );
    }
}
