//! Secrets at rest: S3 secret keys are stored sealed (ChaCha20-Poly1305, `ring`), with a key kept outside the
//! database.
//!
//! SigV4 verification needs an S3 secret key itself, so it cannot be stored as a hash as bearer tokens are.
//! Each is sealed with the catalog key under a fresh random nonce, bound to its principal's id (the
//! additional data), and stored as `enc1:<hex of nonce, ciphertext and tag>`. The key lives in
//! `STRATA_CATALOG_KEY` (64 hex digits; what the agents of a cluster sharing a PostgreSQL catalog set) or in a
//! key file beside the database (`<data-dir>/catalog.key`, mode 0600, made on first start). The catalog keeps
//! only a keyed check value of it (`catalog_keys`), so an agent given the wrong key refuses to start instead of
//! failing every signature.
//!
//! What the database file alone gives an attacker: principal names, teams, token *hashes* (blake3 of 240-bit
//! random tokens: not reversible) and sealed S3 secrets, none usable to sign a request or call the API.

use std::fmt;

use ring::aead::{Aad, CHACHA20_POLY1305, LessSafeKey, NONCE_LEN, Nonce, UnboundKey};
use ring::rand::{SecureRandom, SystemRandom};
use sqlx::Row;
use strata_types::{Error, ErrorKind, Result};

use crate::{Catalog, db_err};

/// The prefix of a sealed value.
const SEALED: &str = "enc1:";

/// The catalog key: 32 bytes.
#[derive(Clone)]
pub struct CatalogKey([u8; 32]);

impl fmt::Debug for CatalogKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str("CatalogKey(..)")
    }
}

impl CatalogKey {
    /// A fresh random key.
    pub fn generate() -> Result<Self> {
        let mut k = [0u8; 32];
        SystemRandom::new()
            .fill(&mut k)
            .map_err(|_| Error::internal("no system randomness for a catalog key"))?;
        Ok(Self(k))
    }

    /// A key from 64 hex digits (surrounding white space ignored).
    pub fn from_hex(text: &str) -> Result<Self> {
        let t = text.trim();
        let bad = || Error::config("the catalog key must be 64 hex digits (32 bytes)");
        if t.len() != 64 {
            return Err(bad());
        }
        let mut k = [0u8; 32];
        for (i, b) in k.iter_mut().enumerate() {
            *b = u8::from_str_radix(t.get(2 * i..2 * i + 2).ok_or_else(bad)?, 16)
                .map_err(|_| bad())?;
        }
        Ok(Self(k))
    }

    /// The key as 64 hex digits (what a key file holds).
    pub fn to_hex(&self) -> String {
        self.0.iter().map(|b| format!("{b:02x}")).collect()
    }

    /// A key for one `purpose` (listing tokens, ...), derived from this one: the agents sharing a catalog key
    /// share it, and it reveals nothing of the catalog key.
    pub fn derive(&self, purpose: &str) -> CatalogKey {
        CatalogKey(blake3::derive_key(
            &format!("strata catalog key 2026-12 {purpose}"),
            &self.0,
        ))
    }

    /// A value that tells keys apart without revealing them.
    fn check_value(&self) -> String {
        blake3::keyed_hash(&self.0, b"strata catalog key check v1")
            .to_hex()
            .to_string()
    }

    fn aead(&self) -> Result<LessSafeKey> {
        UnboundKey::new(&CHACHA20_POLY1305, &self.0)
            .map(LessSafeKey::new)
            .map_err(|_| Error::internal("catalog key"))
    }

    /// Seal `plain`, bound to `context` (the principal's id).
    pub fn seal(&self, context: &str, plain: &str) -> Result<String> {
        let mut nonce = [0u8; NONCE_LEN];
        SystemRandom::new()
            .fill(&mut nonce)
            .map_err(|_| Error::internal("no system randomness for a nonce"))?;
        let mut buf = plain.as_bytes().to_vec();
        self.aead()?
            .seal_in_place_append_tag(
                Nonce::assume_unique_for_key(nonce),
                Aad::from(context.as_bytes()),
                &mut buf,
            )
            .map_err(|_| Error::internal("sealing a secret"))?;
        let mut out = String::with_capacity(SEALED.len() + 2 * (NONCE_LEN + buf.len()));
        out.push_str(SEALED);
        for b in nonce.iter().chain(buf.iter()) {
            out.push_str(&format!("{b:02x}"));
        }
        Ok(out)
    }

    /// Open a value sealed by [`Self::seal`] for `context`.
    pub fn open(&self, context: &str, sealed: &str) -> Result<String> {
        let corrupt = || {
            Error::new(
                ErrorKind::Corrupt,
                "a sealed secret of the catalog does not open with the catalog key",
            )
        };
        let hex = sealed.strip_prefix(SEALED).ok_or_else(corrupt)?;
        if hex.len() % 2 != 0 || hex.len() < 2 * NONCE_LEN {
            return Err(corrupt());
        }
        let bytes = (0..hex.len() / 2)
            .map(|i| u8::from_str_radix(&hex[2 * i..2 * i + 2], 16))
            .collect::<std::result::Result<Vec<u8>, _>>()
            .map_err(|_| corrupt())?;
        let (nonce, rest) = bytes.split_at(NONCE_LEN);
        let nonce = Nonce::try_assume_unique_for_key(nonce).map_err(|_| corrupt())?;
        let mut buf = rest.to_vec();
        let plain = self
            .aead()?
            .open_in_place(nonce, Aad::from(context.as_bytes()), &mut buf)
            .map_err(|_| corrupt())?;
        String::from_utf8(plain.to_vec()).map_err(|_| corrupt())
    }
}

/// Whether a stored value is sealed.
pub(crate) fn is_sealed(v: &str) -> bool {
    v.starts_with(SEALED)
}

impl Catalog {
    /// Seal this catalog's secrets with `key`: checks that `key` is the one the catalog's secrets were sealed
    /// with (recording it on first use), and seals any secret still stored in clear (catalogs made before
    /// secrets were sealed). A different key is a [`ErrorKind::Config`] error: nothing is changed.
    pub async fn with_key(mut self, key: CatalogKey) -> Result<Self> {
        let check = key.check_value();
        let mut tx = self.pool().begin().await.map_err(db_err)?;
        let known: Option<String> =
            sqlx::query("SELECT check_value FROM catalog_keys WHERE id = 'secrets'")
                .fetch_optional(&mut *tx)
                .await
                .map_err(db_err)?
                .map(|r| r.try_get("check_value"))
                .transpose()
                .map_err(db_err)?;
        match known {
            Some(k) if k != check => {
                return Err(Error::config(
                    "the catalog's secrets are sealed with another key: give this agent the key the other \
                     agents use (STRATA_CATALOG_KEY, or the same catalog.key file)",
                ));
            }
            Some(_) => {}
            None => {
                // Agents of a cluster start together on a fresh catalog: the first insert wins, and every
                // other agent's key is checked against it.
                sqlx::query(
                    "INSERT INTO catalog_keys (id, check_value) VALUES ('secrets', $1) \
                     ON CONFLICT (id) DO NOTHING",
                )
                .bind(&check)
                .execute(&mut *tx)
                .await
                .map_err(db_err)?;
                let now: String =
                    sqlx::query_scalar("SELECT check_value FROM catalog_keys WHERE id = 'secrets'")
                        .fetch_one(&mut *tx)
                        .await
                        .map_err(db_err)?;
                if now != check {
                    return Err(Error::config(
                        "the catalog's secrets are sealed with another key: give this agent the key the other \
                         agents use (STRATA_CATALOG_KEY, or the same catalog.key file)",
                    ));
                }
            }
        }
        let clear: Vec<(String, String)> =
            sqlx::query("SELECT id, secret_key FROM principals WHERE secret_key IS NOT NULL")
                .fetch_all(&mut *tx)
                .await
                .map_err(db_err)?
                .into_iter()
                .map(|r| {
                    Ok((
                        r.try_get("id").map_err(db_err)?,
                        r.try_get("secret_key").map_err(db_err)?,
                    ))
                })
                .collect::<Result<Vec<(String, String)>>>()?
                .into_iter()
                .filter(|(_, s)| !is_sealed(s))
                .collect();
        for (id, secret) in &clear {
            sqlx::query("UPDATE principals SET secret_key = $1 WHERE id = $2")
                .bind(key.seal(id, secret)?)
                .bind(id)
                .execute(&mut *tx)
                .await
                .map_err(db_err)?;
        }
        tx.commit().await.map_err(db_err)?;
        if !clear.is_empty() {
            tracing::info!(
                sealed = clear.len(),
                "sealed S3 secret keys stored in clear"
            );
        }
        self.key = Some(std::sync::Arc::new(key));
        Ok(self)
    }

    /// A key for `purpose` derived from the catalog key ([`CatalogKey::derive`]).
    pub fn derived_key(&self, purpose: &str) -> Result<CatalogKey> {
        Ok(self.key()?.derive(purpose))
    }

    /// The catalog key, or the error of a catalog that has none.
    pub(crate) fn key(&self) -> Result<&CatalogKey> {
        self.key.as_deref().ok_or_else(|| {
            Error::config(
                "this catalog has no key (Catalog::with_key), so it stores and reads no S3 secret",
            )
        })
    }
}
