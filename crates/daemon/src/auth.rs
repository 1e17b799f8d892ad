//! The TCP API's bearer token.

use std::path::{Path, PathBuf};

use crate::{Error, Result};

/// The bearer token for the TCP API: read from `path`, or made (32 random
/// bytes in hex, mode 0600) if there is none. A token file others can read
/// is refused.
pub fn token(path: &Path) -> Result<String> {
    use std::os::unix::fs::{OpenOptionsExt, PermissionsExt};
    match std::fs::metadata(path) {
        Ok(m) => {
            if m.permissions().mode() & 0o077 != 0 {
                return Err(Error::Invalid(format!(
                    "token file {} is readable by others (chmod 600 it)",
                    path.display()
                )));
            }
            let t = std::fs::read_to_string(path)?.trim().to_string();
            if t.len() < 16 {
                return Err(Error::Invalid(format!(
                    "token file {}: the token is shorter than 16 characters",
                    path.display()
                )));
            }
            Ok(t)
        }
        Err(e) if e.kind() == std::io::ErrorKind::NotFound => {
            let mut b = [0u8; 32];
            // SAFETY: getrandom writes at most b.len() bytes into b.
            if unsafe { libc::getrandom(b.as_mut_ptr().cast(), b.len(), 0) } != b.len() as isize {
                return Err(std::io::Error::last_os_error().into());
            }
            let t: String = b.iter().map(|x| format!("{x:02x}")).collect();
            let mut f = std::fs::OpenOptions::new()
                .write(true)
                .create_new(true)
                .mode(0o600)
                .open(path)?;
            std::io::Write::write_all(&mut f, format!("{t}\n").as_bytes())?;
            Ok(t)
        }
        Err(e) => Err(e.into()),
    }
}

/// Where the daemon also listens besides its Unix socket: TLS on TCP.
pub struct TcpApi {
    /// host:port
    pub addr: String,
    pub token_file: PathBuf,
    /// The certificate and key (PEM), made self-signed if neither exists.
    pub cert: PathBuf,
    pub key: PathBuf,
}

/// The TCP API's certificate: loaded, or made on first start for the
/// names a client may use (`localhost`, this host's name, the address it
/// listens on).
pub fn tls_identity(t: &TcpApi) -> Result<domus_http::tls::Identity> {
    let mut names = vec!["localhost".to_string()];
    if let Ok(h) = std::fs::read_to_string("/proc/sys/kernel/hostname") {
        names.push(h.trim().to_string());
    }
    let host = domus_http::tls::host_of(&t.addr);
    if !host.is_empty() && !matches!(host, "0.0.0.0" | "::") {
        names.push(host.to_string());
    }
    names.retain(|n| !n.is_empty());
    names.dedup();
    domus_http::tls::load_or_make(&t.cert, &t.key, &names)
        .map_err(|e| Error::Invalid(e.to_string()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_token_is_made_once_and_kept_private() {
        use std::os::unix::fs::PermissionsExt;
        let dir = std::env::temp_dir().join(format!("domus-token-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let p = dir.join("token");
        let t = token(&p).unwrap();
        assert_eq!(t.len(), 64);
        assert_eq!(token(&p).unwrap(), t, "read back, not made again");
        let mode = std::fs::metadata(&p).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o600);
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o644)).unwrap();
        assert!(token(&p)
            .unwrap_err()
            .to_string()
            .contains("readable by others"));
        std::fs::write(&p, "short").unwrap();
        std::fs::set_permissions(&p, std::fs::Permissions::from_mode(0o600)).unwrap();
        assert!(token(&p).unwrap_err().to_string().contains("shorter"));
        let _ = std::fs::remove_dir_all(dir);
    }
}
