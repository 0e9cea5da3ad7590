//! The bank tier: shared cache servers (memcached, Redis) behind the peers and before home (IMCa; design
//! note 015). A unit is kept under its key's digest; the value is the digest, the unit's crc32c and its
//! bytes, framed and checked again by the bank. Fills go through the bank's background writer, so a
//! reader never waits for one; every bank failure is a miss.

use std::sync::Arc;
use std::time::Duration;

use larder_fs::key::KeyDigest;
use larder_fs::tier::{Tier, TierError, Unit, Want};

use crate::Bank;

/// Digest and crc32c before a unit's bytes.
const PREFIX: usize = 16 + 4;

pub struct BankTier {
    bank: Arc<Bank>,
    ttl: Duration,
}

impl BankTier {
    /// Units kept in `bank` at most `ttl` (zero: until the servers evict them).
    pub fn new(bank: Arc<Bank>, ttl: Duration) -> BankTier {
        BankTier { bank, ttl }
    }
}

fn key(digest: &KeyDigest) -> String {
    format!("larder/u/{digest}")
}

impl Tier for BankTier {
    fn name(&self) -> &'static str {
        "bank"
    }

    fn shared(&self) -> bool {
        true
    }

    // The bank checks the crc32c of the whole value, the digest and the unit's checksum with the bytes.
    fn checks_own_answers(&self) -> bool {
        true
    }

    fn get(&self, want: &Want) -> Result<Option<Unit>, TierError> {
        let Some(mut value) = self
            .bank
            .get(&key(&want.digest))
            .map_err(|e| TierError::Unavailable(e.to_string()))?
        else {
            return Ok(None);
        };
        if value.len() < PREFIX {
            return Err(TierError::Io(format!(
                "a bank value of {} bytes is not a unit",
                value.len()
            )));
        }
        let digest = KeyDigest(value[..16].try_into().expect("16 bytes"));
        let crc32c = u32::from_le_bytes(value[16..PREFIX].try_into().expect("4 bytes"));
        value.drain(..PREFIX);
        Ok(Some(Unit {
            data: Arc::new(value),
            crc32c,
            key: digest,
        }))
    }

    fn offer(&self, want: &Want, unit: &Unit) -> Result<(), TierError> {
        let mut value = Vec::with_capacity(PREFIX + unit.data.len());
        value.extend_from_slice(&unit.key.0);
        value.extend_from_slice(&unit.crc32c.to_le_bytes());
        value.extend_from_slice(&unit.data);
        self.bank.put_later(key(&want.digest), value, self.ttl);
        Ok(())
    }
}
