//! The Domus VMM: one domain in one process. [`config`] checks what the user
//! asked for, [`vm`] builds the KVM VM, loads the kernel and runs vCPU threads
//! until the guest powers off, resets or crashes, [`cpuid`] and [`vcpu`] set up
//! the virtual CPUs, [`snapshot`] saves a domain and gives a restore its
//! pieces, and [`probe`] tells whether /dev/kvm runs kernel code at
//! hardware speed.

pub mod affinity;
pub mod api;
pub mod config;
pub mod console;
pub mod cpuid;
pub mod hotplug;
pub mod irq;
pub mod memory;
pub mod migration;
#[cfg(test)]
mod openapi_check;
pub mod pause;
pub mod probe;
pub mod registry;
pub mod seccomp;
pub mod snapshot;
pub mod vcpu;
pub mod vm;

pub use config::{Console, VmConfig};
pub use vm::{run, ExitReason, Restore};

/// Errors of the VMM. [`Error::is_user_error`] separates bad input (exit
/// status 2) from failures of the host or of KVM.
#[derive(Debug, thiserror::Error)]
pub enum Error {
    #[error("{0}")]
    Config(#[from] config::ConfigError),
    #[error("cannot open /dev/kvm")]
    OpenKvm(#[source] kvm_ioctls::Error),
    #[error("KVM API: {what}")]
    Kvm {
        what: &'static str,
        #[source]
        source: kvm_ioctls::Error,
    },
    #[error("cannot allocate {0} MiB of guest memory")]
    Memory(u64, #[source] memory::MemoryError),
    #[error("cannot prefault guest memory")]
    Prefault(#[source] memory::MemoryError),
    #[error("kernel {path}: {source}")]
    Kernel {
        path: String,
        #[source]
        source: domus_boot::kernel::Error,
    },
    #[error("{0}")]
    Layout(#[from] domus_boot::params::Error),
    #[error("initrd {path}")]
    Initrd {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Seccomp(#[from] seccomp::SeccompError),
    #[error("{0}")]
    Jail(#[from] domus_jail::JailError),
    #[error("writing boot data into guest memory")]
    GuestMemory(#[from] vm_memory::GuestMemoryError),
    #[error("console {path}")]
    ConsoleFile {
        path: String,
        #[source]
        source: std::io::Error,
    },
    #[error("{0}")]
    Io(&'static str, #[source] std::io::Error),
    #[error("{0}")]
    Disk(#[from] domus_virtio::block::OpenError),
    #[error("{0}")]
    Net(#[from] domus_virtio::net::NetError),
    #[error("{0}")]
    Vsock(#[from] domus_virtio::vsock::VsockError),
    #[error("{0}")]
    Devices(String),
    #[error("cpuid rule {0}: this host's KVM offers no such leaf and subleaf")]
    CpuidLeaf(domus_api::cpuid::CpuidRule),
    #[error("restoring: {0}")]
    Snapshot(#[from] snapshot::SnapshotError),
}

impl Error {
    pub fn is_user_error(&self) -> bool {
        matches!(
            self,
            Error::Config(_)
                | Error::Layout(_)
                | Error::Kernel { .. }
                | Error::Initrd { .. }
                | Error::ConsoleFile { .. }
                | Error::Disk(_)
                | Error::Net(_)
                | Error::Vsock(_)
                | Error::CpuidLeaf(_)
                | Error::Snapshot(
                    snapshot::SnapshotError::File(_)
                        | snapshot::SnapshotError::Cpu(_)
                        | snapshot::SnapshotError::MemoryTruncated { .. }
                        | snapshot::SnapshotError::MemoryCorrupt { .. }
                        | snapshot::SnapshotError::Machine(_)
                )
        )
    }
}

pub type Result<T> = std::result::Result<T, Error>;

pub(crate) fn kvm_err(what: &'static str) -> impl FnOnce(kvm_ioctls::Error) -> Error {
    move |source| Error::Kvm { what, source }
}
