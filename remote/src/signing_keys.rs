//! Ed25519 keys of the fleet tier, in the text form Nix binary caches use:
//! `<name>:<base64 of 32 bytes>` (the seed in a secret key file, the public
//! key in `trusted_keys`). Files hold one such line.

use std::io::Write;
use std::path::{Path, PathBuf};

use base64::engine::general_purpose::STANDARD;
use base64::Engine;
use ed25519_dalek::{Signer, SigningKey, VerifyingKey};

/// Longest key name accepted (it is a label, not data).
const MAX_NAME_LEN: usize = 128;

/// Why a key could not be read, parsed or written.
#[derive(Debug, thiserror::Error)]
pub enum KeyError {
    /// Reading or writing a key file failed.
    #[error("{path}: {source}")]
    Io {
        /// The key file.
        path: PathBuf,
        /// The I/O error.
        source: std::io::Error,
    },
    /// The text is not `<name>:<base64 of 32 bytes>` or not a valid key.
    #[error("key {text:?}: {detail}")]
    Malformed {
        /// The key's name part only (secret material is never echoed).
        text: String,
        /// What is wrong with it.
        detail: String,
    },
    /// A new key would overwrite an existing file.
    #[error("{path} exists; refusing to overwrite a key")]
    Exists {
        /// The existing file.
        path: PathBuf,
    },
    /// The system random source failed while generating a key.
    #[error("no system randomness: {0}")]
    Random(String),
}

/// A key this host signs manifests with.
pub struct SecretKey {
    /// The key's label; manifests carry it so readers can name the signer.
    pub name: String,
    key: SigningKey,
}

/// A public key whose manifests a host accepts.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PublicKey {
    /// The key's label, as in `trusted_keys`.
    pub name: String,
    /// The Ed25519 public key.
    pub key: VerifyingKey,
}

fn split<'a>(text: &'a str, what: &str) -> Result<(&'a str, [u8; 32]), KeyError> {
    let bad = |detail: String| KeyError::Malformed {
        // Never echo secret material.
        text: text.split(':').next().unwrap_or_default().to_string(),
        detail,
    };
    let (name, b64) = text
        .trim()
        .split_once(':')
        .ok_or_else(|| bad(format!("expected <name>:<base64 {what}>")))?;
    check_name(name).map_err(|d| bad(d.to_string()))?;
    let bytes = STANDARD
        .decode(b64)
        .map_err(|e| bad(format!("{what} is not base64: {e}")))?;
    let bytes: [u8; 32] = bytes
        .try_into()
        .map_err(|v: Vec<u8>| bad(format!("{what} has {} bytes, expected 32", v.len())))?;
    Ok((name, bytes))
}

fn check_name(name: &str) -> Result<(), &'static str> {
    if name.is_empty() || name.len() > MAX_NAME_LEN {
        return Err("the name must have 1 to 128 characters");
    }
    if !name
        .bytes()
        .all(|b| b.is_ascii_alphanumeric() || b"-_.".contains(&b))
    {
        return Err("the name may hold only letters, digits, '-', '_' and '.'");
    }
    Ok(())
}

impl PublicKey {
    /// Parses `<name>:<base64 public key>`, as written in `trusted_keys`.
    pub fn parse(text: &str) -> Result<PublicKey, KeyError> {
        let (name, bytes) = split(text, "public key")?;
        let key = VerifyingKey::from_bytes(&bytes).map_err(|e| KeyError::Malformed {
            text: text.to_string(),
            detail: format!("not an Ed25519 public key: {e}"),
        })?;
        Ok(PublicKey {
            name: name.to_string(),
            key,
        })
    }

    /// The `<name>:<base64>` form that [`PublicKey::parse`] reads.
    pub fn to_text(&self) -> String {
        format!("{}:{}", self.name, STANDARD.encode(self.key.as_bytes()))
    }
}

impl SecretKey {
    /// A new key from the system's randomness.
    pub fn generate(name: &str) -> Result<SecretKey, KeyError> {
        check_name(name).map_err(|d| KeyError::Malformed {
            text: name.to_string(),
            detail: d.to_string(),
        })?;
        let mut seed = [0u8; 32];
        getrandom::fill(&mut seed).map_err(|e| KeyError::Random(e.to_string()))?;
        Ok(SecretKey {
            name: name.to_string(),
            key: SigningKey::from_bytes(&seed),
        })
    }

    /// Parses `<name>:<base64 seed>`, the content of a secret key file.
    pub fn parse(text: &str) -> Result<SecretKey, KeyError> {
        let (name, seed) = split(text, "secret key")?;
        Ok(SecretKey {
            name: name.to_string(),
            key: SigningKey::from_bytes(&seed),
        })
    }

    /// Reads a secret key file (one line, as [`SecretKey::parse`] takes it).
    pub fn load(path: &Path) -> Result<SecretKey, KeyError> {
        let text = std::fs::read_to_string(path).map_err(|source| KeyError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        SecretKey::parse(&text)
    }

    /// The public half, to hand to other hosts' `trusted_keys`.
    pub fn public(&self) -> PublicKey {
        PublicKey {
            name: self.name.clone(),
            key: self.key.verifying_key(),
        }
    }

    pub(crate) fn sign(&self, message: &[u8]) -> [u8; 64] {
        self.key.sign(message).to_bytes()
    }

    fn to_text(&self) -> String {
        format!("{}:{}", self.name, STANDARD.encode(self.key.to_bytes()))
    }

    /// Writes the secret key (mode 0600) to `secret` and the public key to
    /// `public`; refuses to overwrite either.
    pub fn write_pair(&self, secret: &Path, public: &Path) -> Result<(), KeyError> {
        write_new(secret, &self.to_text(), 0o600)?;
        write_new(public, &self.public().to_text(), 0o644)
    }
}

fn write_new(path: &Path, text: &str, mode: u32) -> Result<(), KeyError> {
    use std::os::unix::fs::OpenOptionsExt;
    let io = |source| KeyError::Io {
        path: path.to_path_buf(),
        source,
    };
    let mut f = std::fs::OpenOptions::new()
        .write(true)
        .create_new(true)
        .mode(mode)
        .open(path)
        .map_err(|e| match e.kind() {
            std::io::ErrorKind::AlreadyExists => KeyError::Exists {
                path: path.to_path_buf(),
            },
            _ => io(e),
        })?;
    writeln!(f, "{text}").map_err(io)?;
    f.sync_all().map_err(io)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn text_round_trip() {
        let k = SecretKey::generate("host-1").unwrap();
        let again = SecretKey::parse(&k.to_text()).unwrap();
        assert_eq!(again.public(), k.public());
        let p = PublicKey::parse(&k.public().to_text()).unwrap();
        assert_eq!(p, k.public());
        assert_eq!(p.name, "host-1");
    }

    #[test]
    fn malformed_keys_are_refused_without_echoing_secrets() {
        assert!(PublicKey::parse("nocolon").is_err());
        assert!(PublicKey::parse("a:@@@").is_err());
        assert!(PublicKey::parse(&format!("a:{}", STANDARD.encode([1u8; 31]))).is_err());
        assert!(PublicKey::parse(&format!("bad name:{}", STANDARD.encode([1u8; 32]))).is_err());
        let secret = format!("k:{}", STANDARD.encode([7u8; 33]));
        let msg = SecretKey::parse(&secret).err().unwrap().to_string();
        assert!(!msg.contains(&STANDARD.encode([7u8; 33])), "{msg}");
    }

    #[test]
    fn write_pair_refuses_to_overwrite_and_keeps_the_secret_private() {
        use std::os::unix::fs::PermissionsExt;
        let d = tempfile::tempdir().unwrap();
        let (s, p) = (d.path().join("k.secret"), d.path().join("k.pub"));
        let k = SecretKey::generate("k").unwrap();
        k.write_pair(&s, &p).unwrap();
        let mode = std::fs::metadata(&s).unwrap().permissions().mode() & 0o777;
        assert_eq!(mode, 0o600);
        assert_eq!(SecretKey::load(&s).unwrap().public(), k.public());
        assert_eq!(
            PublicKey::parse(&std::fs::read_to_string(&p).unwrap()).unwrap(),
            k.public()
        );
        assert!(matches!(k.write_pair(&s, &p), Err(KeyError::Exists { .. })));
    }
}
