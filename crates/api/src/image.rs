//! Images that `domus image build` makes, as their directory records them
//! (`image.json` beside the disk, the kernel and the initrd), and how a
//! domain uses one (`image = "NAME"` in its configuration).

use std::path::PathBuf;

use serde::{Deserialize, Serialize};

/// The file in an image's directory that describes it.
pub const RECORD: &str = "image.json";

/// One image: the files are named relative to its directory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageRecord {
    pub name: String,
    /// Debian's suite (bookworm, trixie, ...); for an imported image its
    /// os-release's VERSION_CODENAME (noble, ...).
    pub suite: String,
    /// The packages installed beyond the base set, as asked.
    #[serde(default)]
    pub packages: Vec<String>,
    /// The root disk's size (as the guest sees it), in bytes.
    pub size_bytes: u64,
    /// The qcow2 root disk, the guest's `/dev/vda` (built: an ext4 file
    /// system without a partition table; imported: as the user's disk was).
    pub disk: PathBuf,
    pub kernel: PathBuf,
    pub initrd: PathBuf,
    /// The kernel's version (`6.1.0-50-cloud-amd64`).
    pub kernel_version: String,
    /// Seconds since the epoch when it was built.
    pub built: u64,
    /// A hash of everything the build was asked (suite, packages, size,
    /// the build's own version): the same inputs build the same image.
    pub inputs: String,
    /// The kernel's `root=` for domains of this image (`UUID=...` for an
    /// imported one); none: `/dev/vda`, the whole first disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub root: Option<String>,
    /// The file `domus image import` made it from; none: built.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub source: Option<PathBuf>,
}

/// A listed image: its record and where it is.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageInfo {
    pub dir: PathBuf,
    #[serde(flatten)]
    pub record: ImageRecord,
    /// Bytes the image's files take on the host's disk.
    pub host_bytes: u64,
}

/// How a domain uses an image (`image =` in its configuration): the
/// daemon made its root disk, a copy-on-write overlay on the image's, and
/// its cloud-init seed disk.
#[derive(Clone, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct ImageUse {
    pub name: String,
    /// `image_keep = 1`: the overlay outlives the domain.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub keep: bool,
    /// The SSH public keys cloud-init gives the default user (`ssh_keys`;
    /// the CLI adds the user's `~/.ssh/*.pub` when there are none).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub ssh_keys: Vec<String>,
    /// What the daemon made, once it has: the overlay (the domain's first
    /// disk) and the seed (its last).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub overlay: Option<PathBuf>,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub seed: Option<PathBuf>,
}
