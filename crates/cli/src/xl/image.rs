//! `domus image build|import|list|rm`: images in the state directory's
//! `images/` (or `--dir`), built, imported and read locally; the daemon
//! serves that directory.

use std::path::PathBuf;
use std::process::ExitCode;

use domus_image::{BuildOptions, ImportOptions, Store};

use super::{print_json, verb, StateArg};

#[derive(clap::Args)]
pub struct ImageArgs {
    #[command(subcommand)]
    pub verb: ImageVerb,
}

#[derive(clap::Subcommand)]
pub enum ImageVerb {
    /// Build a bootable Debian image from Debian's packages (as root).
    Build(BuildArgs),
    /// Import a cloud image you bring (Debian's or Ubuntu's genericcloud
    /// qcow2, or any raw or qcow2 disk with an ext4 Linux root): its
    /// kernel and initrd are taken out for direct boot.
    Import(ImportArgs),
    /// The images, with their suite, kernel, size and packages.
    List(ListArgs),
    /// Remove an image (refused while a domain's overlay uses it).
    Rm(RmArgs),
}

#[derive(clap::Args)]
pub struct DirArgs {
    #[command(flatten)]
    pub state: StateArg,
    /// The image directory [default: the state directory's images/]
    #[arg(long, value_name = "DIR")]
    pub dir: Option<PathBuf>,
}

impl DirArgs {
    fn dir(&self) -> PathBuf {
        self.dir
            .clone()
            .unwrap_or_else(|| domus_daemon::state_dir(self.state.state_dir.clone()).join("images"))
    }
}

#[derive(clap::Args)]
pub struct BuildArgs {
    #[command(flatten)]
    pub at: DirArgs,
    /// Debian's suite.
    #[arg(long, default_value = "bookworm")]
    pub suite: String,
    /// The root disk's size (the qcow2 image only takes what is written).
    #[arg(long, default_value = "4G", value_parser = domus_api::spec::parse_size)]
    pub size: u64,
    /// More packages, comma-separated.
    #[arg(long, value_delimiter = ',')]
    pub packages: Vec<String>,
    /// The Debian mirror [default: the one this host's apt uses]
    #[arg(long)]
    pub mirror: Option<String>,
    /// Do nothing if an image of this name was built from the same inputs
    /// (suite, size, packages); rebuild it if from others.
    #[arg(long)]
    pub if_changed: bool,
    pub name: String,
}

#[derive(clap::Args)]
pub struct ImportArgs {
    #[command(flatten)]
    pub at: DirArgs,
    /// The disk image (raw or qcow2, read from its first bytes).
    pub file: PathBuf,
    pub name: String,
}

#[derive(clap::Args)]
pub struct ListArgs {
    #[command(flatten)]
    pub at: DirArgs,
    /// Print JSON.
    #[arg(long)]
    pub json: bool,
}

#[derive(clap::Args)]
pub struct RmArgs {
    #[command(flatten)]
    pub at: DirArgs,
    pub name: String,
}

pub fn image(a: ImageArgs) -> ExitCode {
    match a.verb {
        ImageVerb::Build(b) => build(b),
        ImageVerb::Import(i) => import(i),
        ImageVerb::List(l) => list(l),
        ImageVerb::Rm(r) => rm(r),
    }
}

fn build(a: BuildArgs) -> ExitCode {
    verb(|| {
        let dir = a.at.dir();
        let opts = BuildOptions {
            name: a.name.clone(),
            suite: a.suite,
            size: a.size,
            packages: a.packages.into_iter().filter(|p| !p.is_empty()).collect(),
            mirror: a.mirror,
        };
        let store = Store::new(vec![dir.clone()]);
        if a.if_changed {
            if let Ok(old) = store.find(&opts.name) {
                if old.record.inputs == opts.inputs() {
                    eprintln!(
                        "domus: image {} is up to date ({})",
                        opts.name,
                        old.dir.display()
                    );
                    return Ok(ExitCode::SUCCESS);
                }
                eprintln!(
                    "domus: image {} was built from other inputs: building it again",
                    opts.name
                );
                let overlays = domus_daemon::overlay_dir(&domus_daemon::state_dir(
                    a.at.state.state_dir.clone(),
                ));
                store
                    .remove(&opts.name, &overlays)
                    .map_err(|e| e.to_string())?;
            }
        }
        let started = std::time::Instant::now();
        let rec = domus_image::build(&dir, &opts, &mut |step| {
            eprintln!("domus image build: {step}")
        })
        .map_err(|e| e.to_string())?;
        eprintln!(
            "domus image build: {} ready in {:.0} s: Debian {} with kernel {} in {}",
            rec.name,
            started.elapsed().as_secs_f64(),
            rec.suite,
            rec.kernel_version,
            dir.join(&rec.name).display()
        );
        Ok(ExitCode::SUCCESS)
    })
}

fn import(a: ImportArgs) -> ExitCode {
    verb(|| {
        let dir = a.at.dir();
        let started = std::time::Instant::now();
        let opts = ImportOptions {
            name: a.name,
            source: a.file,
        };
        let rec = domus_image::import(&dir, &opts, &mut |step| {
            eprintln!("domus image import: {step}")
        })
        .map_err(|e| e.to_string())?;
        eprintln!(
            "domus image import: {} ready in {:.0} s: {} with kernel {}, root {}, in {}",
            rec.name,
            started.elapsed().as_secs_f64(),
            rec.suite,
            rec.kernel_version,
            rec.root.as_deref().unwrap_or("/dev/vda"),
            dir.join(&rec.name).display()
        );
        Ok(ExitCode::SUCCESS)
    })
}

fn list(a: ListArgs) -> ExitCode {
    let images = Store::new(vec![a.at.dir()]).list();
    if a.json {
        print_json(&images);
        return ExitCode::SUCCESS;
    }
    println!(
        "{:<20} {:<10} {:<22} {:>8} {:>9}  packages",
        "Name", "Suite", "Kernel", "Size", "On disk"
    );
    for i in images {
        let r = &i.record;
        println!(
            "{:<20} {:<10} {:<22} {:>7}M {:>8}M  {}",
            r.name,
            r.suite,
            r.kernel_version,
            r.size_bytes >> 20,
            i.host_bytes >> 20,
            r.packages.join(",")
        );
    }
    ExitCode::SUCCESS
}

fn rm(a: RmArgs) -> ExitCode {
    verb(|| {
        let overlays =
            domus_daemon::overlay_dir(&domus_daemon::state_dir(a.at.state.state_dir.clone()));
        Store::new(vec![a.at.dir()])
            .remove(&a.name, &overlays)
            .map_err(|e| e.to_string())?;
        eprintln!("domus: image {} removed", a.name);
        Ok(ExitCode::SUCCESS)
    })
}
