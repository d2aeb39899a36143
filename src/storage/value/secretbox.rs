//! `secretbox`: XSalsa20-Poly1305 with a 32-byte key, laid out as kube-apiserver lays it out: a random 24-byte nonce,
//! then the sealed box.

use crypto_secretbox::aead::{Aead, KeyInit};
use crypto_secretbox::{Nonce, XSalsa20Poly1305};
use rand::RngCore;

use super::{Transform, ValueError};

const NONCE: usize = 24;

pub struct Secretbox(XSalsa20Poly1305);

impl Secretbox {
    pub fn new(key: &[u8]) -> Result<Self, ValueError> {
        XSalsa20Poly1305::new_from_slice(key)
            .map(Self)
            .map_err(|_| ValueError::new(format!("invalid secretbox key size {}", key.len())))
    }
}

impl Transform for Secretbox {
    fn transform_from_storage(&self, data: &[u8], _context: &[u8]) -> Result<Vec<u8>, ValueError> {
        if data.len() < NONCE + 16 {
            return Err(ValueError::new("the stored data was shorter than the required size"));
        }
        let (nonce, sealed) = data.split_at(NONCE);
        self.0
            .decrypt(Nonce::from_slice(nonce), sealed)
            .map_err(|_| ValueError::new("output array was not large enough for encryption"))
    }

    fn transform_to_storage(&self, data: &[u8], _context: &[u8]) -> Result<Vec<u8>, ValueError> {
        let mut nonce = [0u8; NONCE];
        rand::rng().fill_bytes(&mut nonce);
        let sealed = self
            .0
            .encrypt(Nonce::from_slice(&nonce), data)
            .map_err(|_| ValueError::new("secretbox encryption failed"))?;
        Ok([&nonce[..], &sealed].concat())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_and_refuses_another_key() {
        let t = Secretbox::new(&[5u8; 32]).unwrap();
        let stored = t.transform_to_storage(b"{\"a\":1}", b"").unwrap();
        assert_eq!(stored.len(), NONCE + 7 + 16);
        assert_eq!(t.transform_from_storage(&stored, b"").unwrap(), b"{\"a\":1}");
        let other = Secretbox::new(&[6u8; 32]).unwrap();
        assert!(other.transform_from_storage(&stored, b"").is_err());
        assert!(t.transform_from_storage(&stored[..10], b"").is_err());
        assert!(Secretbox::new(&[0u8; 16]).is_err());
    }
}
