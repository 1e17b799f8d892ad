//! `domus-jail`: confining a VMM. The daemon starts each VMM with
//! [`spawn`] in new mount, PID, IPC and UTS namespaces; the VMM, once it
//! has opened everything it needs and before the guest runs, calls
//! [`enter`] (new root, unprivileged user, no capabilities, rlimits,
//! Landlock) and then installs its seccomp filter; files it needs later
//! (hot-plugged disks) reach it as descriptors through [`fdpass`].

mod enter;
pub mod fdpass;
mod spawn;

pub use enter::{enter, Entered, JailError};
pub use spawn::{spawn, Job, Process};
