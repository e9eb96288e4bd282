//! The capture key: one secret that drives both connection sampling and anonymization, so two
//! captures made with the same key file sample the same connections and map every address to
//! the same pseudonym.
//!
//! File format (text, mode 0600):
//! ```text
//! # mimic capture key: keep it secret (same key = same sampling and same pseudonyms)
//! mimic-capture-key-v1 <128 hex digits>
//! ```
//! The 64 secret bytes split into independent sub-keys: 16 for the sampling SipHash, 32 for
//! Crypto-PAn (AES-128 key and pad), 16 for MAC-address pseudonyms.

use std::fs;
use std::io::{self, Read, Write};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path, PathBuf};

use std::hash::Hasher;

use siphasher::sip128::{Hasher128, SipHasher24 as Sip128};

const MAGIC: &str = "mimic-capture-key-v1";
pub const KEY_BYTES: usize = 64;

#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    #[error("{path}: {source}")]
    Io { path: PathBuf, source: io::Error },
    #[error("{path}: not a mimic capture key ({what}); make one with `mimic capture keygen FILE`")]
    Format { path: PathBuf, what: String },
    #[error(
        "{path}: already exists; refusing to overwrite a key (delete it first if you mean to)"
    )]
    Exists { path: PathBuf },
    #[error(
        "{path}: key file is readable by group or others (mode {mode:o}); run chmod 600 on it"
    )]
    Permissions { path: PathBuf, mode: u32 },
}

/// The secret key. `Debug` prints only the fingerprint.
#[derive(Clone, PartialEq, Eq)]
pub struct CaptureKey {
    bytes: [u8; KEY_BYTES],
}

impl std::fmt::Debug for CaptureKey {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "CaptureKey({})", self.fingerprint())
    }
}

impl CaptureKey {
    pub fn from_bytes(bytes: [u8; KEY_BYTES]) -> CaptureKey {
        CaptureKey { bytes }
    }

    /// A fresh key from the kernel's random source.
    pub fn generate() -> io::Result<CaptureKey> {
        let mut bytes = [0u8; KEY_BYTES];
        fs::File::open("/dev/urandom")?.read_exact(&mut bytes)?;
        Ok(CaptureKey { bytes })
    }

    /// Sampling SipHash key.
    pub fn sampling(&self) -> [u8; 16] {
        self.bytes[0..16].try_into().expect("16 bytes")
    }
    /// Crypto-PAn secret: AES-128 key (first 16) and pad seed (last 16).
    pub fn cryptopan(&self) -> [u8; 32] {
        self.bytes[16..48].try_into().expect("32 bytes")
    }
    /// MAC pseudonym SipHash key.
    pub fn mac(&self) -> [u8; 16] {
        self.bytes[48..64].try_into().expect("16 bytes")
    }

    /// A public 64-bit fingerprint (hex) to tell keys apart in file comments without revealing them.
    pub fn fingerprint(&self) -> String {
        let mut h = Sip128::new_with_keys(0x6d696d6963, 0x6b6579);
        h.write(&self.bytes);
        format!("{:016x}", h.finish128().h1)
    }

    pub fn to_file_text(&self) -> String {
        let hex: String = self.bytes.iter().map(|b| format!("{b:02x}")).collect();
        format!("# mimic capture key: keep it secret (same key = same sampling and same pseudonyms)\n{MAGIC} {hex}\n")
    }

    pub fn parse(text: &str, path: &Path) -> Result<CaptureKey, KeyError> {
        let fmt = |what: &str| KeyError::Format {
            path: path.to_path_buf(),
            what: what.to_string(),
        };
        let line = text
            .lines()
            .map(str::trim)
            .find(|l| !l.is_empty() && !l.starts_with('#'))
            .ok_or_else(|| fmt("no key line"))?;
        let hex = line
            .strip_prefix(MAGIC)
            .ok_or_else(|| fmt("key line does not start with mimic-capture-key-v1"))?
            .trim();
        if hex.len() != KEY_BYTES * 2 {
            return Err(fmt(&format!(
                "expected {} hex digits, found {}",
                KEY_BYTES * 2,
                hex.len()
            )));
        }
        let mut bytes = [0u8; KEY_BYTES];
        for (i, b) in bytes.iter_mut().enumerate() {
            *b = u8::from_str_radix(
                hex.get(2 * i..2 * i + 2)
                    .ok_or_else(|| fmt("not ASCII hex"))?,
                16,
            )
            .map_err(|_| fmt("not hex"))?;
        }
        Ok(CaptureKey { bytes })
    }

    /// Reads a key file, refusing one that others can read.
    pub fn load(path: &Path) -> Result<CaptureKey, KeyError> {
        use std::os::unix::fs::PermissionsExt;
        let io_err = |source| KeyError::Io {
            path: path.to_path_buf(),
            source,
        };
        let meta = fs::metadata(path).map_err(io_err)?;
        let mode = meta.permissions().mode() & 0o777;
        if mode & 0o077 != 0 {
            return Err(KeyError::Permissions {
                path: path.to_path_buf(),
                mode,
            });
        }
        let text = fs::read_to_string(path).map_err(io_err)?;
        Self::parse(&text, path)
    }

    /// Writes the key to a new file with mode 0600 (never overwrites an existing file).
    pub fn save_new(&self, path: &Path) -> Result<(), KeyError> {
        let mut f = match fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .mode(0o600)
            .open(path)
        {
            Ok(f) => f,
            Err(e) if e.kind() == io::ErrorKind::AlreadyExists => {
                return Err(KeyError::Exists {
                    path: path.to_path_buf(),
                })
            }
            Err(source) => {
                return Err(KeyError::Io {
                    path: path.to_path_buf(),
                    source,
                })
            }
        };
        let io_err = |source| KeyError::Io {
            path: path.to_path_buf(),
            source,
        };
        f.write_all(self.to_file_text().as_bytes())
            .map_err(io_err)?;
        f.sync_all().map_err(io_err)?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn roundtrip_and_permissions() {
        let dir = tempfile::tempdir().unwrap();
        let p = dir.path().join("k");
        let k = CaptureKey::generate().unwrap();
        k.save_new(&p).unwrap();
        assert_eq!(CaptureKey::load(&p).unwrap(), k);
        assert!(matches!(k.save_new(&p), Err(KeyError::Exists { .. })));
        use std::os::unix::fs::PermissionsExt;
        fs::set_permissions(&p, fs::Permissions::from_mode(0o644)).unwrap();
        assert!(matches!(
            CaptureKey::load(&p),
            Err(KeyError::Permissions { .. })
        ));
        // Debug shows the fingerprint and nothing of the key, in hex or as a byte list
        let dbg = format!("{k:?}");
        assert_eq!(dbg, format!("CaptureKey({})", k.fingerprint()));
        let text = k.to_file_text();
        let hex = text
            .lines()
            .last()
            .unwrap()
            .split_whitespace()
            .nth(1)
            .unwrap();
        assert_eq!(hex.len(), KEY_BYTES * 2);
        for chunk in hex.as_bytes().chunks(16) {
            assert!(!dbg.contains(std::str::from_utf8(chunk).unwrap()));
        }
    }

    #[test]
    fn bad_files() {
        let p = Path::new("x.key");
        assert!(CaptureKey::parse("hello", p).is_err());
        assert!(CaptureKey::parse("mimic-capture-key-v1 abcd", p).is_err());
        let zz = format!("mimic-capture-key-v1 {}", "zz".repeat(64));
        assert!(CaptureKey::parse(&zz, p)
            .unwrap_err()
            .to_string()
            .contains("not hex"));
    }
}
