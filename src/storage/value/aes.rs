//! AES in CBC mode with PKCS#7 padding (`aescbc`) and in GCM mode (`aesgcm`), laid out as kube-apiserver lays them
//! out: a random IV or nonce first, then the ciphertext.

use aes::cipher::block_padding::{NoPadding, Pkcs7};
use aes::cipher::{BlockCipher, BlockDecrypt, BlockDecryptMut, BlockEncrypt, BlockEncryptMut, KeyIvInit};
use aes::{Aes128, Aes192, Aes256};
use aes_gcm::aead::{Aead, Payload};
use aes_gcm::KeyInit;
use aes_gcm::{AesGcm, Nonce};
use rand::RngCore;

use super::{Transform, ValueError};

const BLOCK: usize = 16;
const GCM_NONCE: usize = 12;

/// `aescbc`: each value is `iv (16 bytes) || AES-CBC(PKCS#7(plaintext))`.
pub struct Cbc(Vec<u8>);

impl Cbc {
    /// A key of 16, 24 or 32 bytes (validated by the configuration).
    pub fn new(key: &[u8]) -> Result<Self, ValueError> {
        if ![16, 24, 32].contains(&key.len()) {
            return Err(ValueError::new(format!("invalid AES key size {}", key.len())));
        }
        Ok(Self(key.to_vec()))
    }
}

/// Decrypts `buf` in place.
fn cbc_decrypt<C>(key: &[u8], iv: &[u8], buf: &mut [u8]) -> Result<(), ValueError>
where
    C: BlockCipher + BlockDecrypt + KeyInit,
{
    let d = cbc::Decryptor::<C>::new_from_slices(key, iv).map_err(|_| ValueError::new("invalid IV size"))?;
    d.decrypt_padded_mut::<NoPadding>(buf)
        .map(drop)
        .map_err(|_| ValueError::new("the stored data is not a multiple of the block size"))
}

/// The length of `plain` without its PKCS#7 padding, checked as kube-apiserver checks it.
fn unpad(plain: &[u8]) -> Result<usize, ValueError> {
    let pad = plain.last().copied().unwrap_or(0) as usize;
    if pad == 0 || pad > plain.len() {
        return Err(ValueError::new("invalid PKCS7 data (empty or not padded)"));
    }
    let size = plain.len() - pad;
    if plain[size..].iter().any(|&b| b as usize != pad) {
        return Err(ValueError::new("invalid padding on input"));
    }
    Ok(size)
}

/// Pads and encrypts the first `len` bytes of `buf` in place.
fn cbc_encrypt<C>(key: &[u8], iv: &[u8], buf: &mut [u8], len: usize) -> Result<usize, ValueError>
where
    C: BlockCipher + BlockEncrypt + KeyInit,
{
    let e = cbc::Encryptor::<C>::new_from_slices(key, iv).map_err(|_| ValueError::new("invalid IV size"))?;
    e.encrypt_padded_mut::<Pkcs7>(buf, len).map(|c| c.len()).map_err(|_| ValueError::new("AES-CBC encryption failed"))
}

impl Transform for Cbc {
    fn transform_from_storage(&self, data: &[u8], _context: &[u8]) -> Result<Vec<u8>, ValueError> {
        if data.len() < BLOCK {
            return Err(ValueError::new("the stored data was shorter than the required size"));
        }
        let (iv, ciphertext) = data.split_at(BLOCK);
        if ciphertext.is_empty() || ciphertext.len() % BLOCK != 0 {
            return Err(ValueError::new("the stored data is not a multiple of the block size"));
        }
        let mut buf = ciphertext.to_vec();
        match self.0.len() {
            16 => cbc_decrypt::<Aes128>(&self.0, iv, &mut buf)?,
            24 => cbc_decrypt::<Aes192>(&self.0, iv, &mut buf)?,
            _ => cbc_decrypt::<Aes256>(&self.0, iv, &mut buf)?,
        }
        buf.truncate(unpad(&buf)?);
        Ok(buf)
    }

    fn transform_to_storage(&self, data: &[u8], _context: &[u8]) -> Result<Vec<u8>, ValueError> {
        let padded = (data.len() / BLOCK + 1) * BLOCK;
        let mut out = vec![0u8; BLOCK + padded];
        rand::rng().fill_bytes(&mut out[..BLOCK]);
        let (iv, body) = out.split_at_mut(BLOCK);
        body[..data.len()].copy_from_slice(data);
        match self.0.len() {
            16 => cbc_encrypt::<Aes128>(&self.0, iv, body, data.len())?,
            24 => cbc_encrypt::<Aes192>(&self.0, iv, body, data.len())?,
            _ => cbc_encrypt::<Aes256>(&self.0, iv, body, data.len())?,
        };
        Ok(out)
    }
}

enum GcmKey {
    K128(AesGcm<Aes128, aes_gcm::aead::consts::U12>),
    K192(AesGcm<Aes192, aes_gcm::aead::consts::U12>),
    K256(AesGcm<Aes256, aes_gcm::aead::consts::U12>),
}

/// `aesgcm`: each value is `nonce (12 bytes) || AES-GCM(plaintext, additional data = the key it is stored under)`.
pub struct Gcm(GcmKey);

impl Gcm {
    pub fn new(key: &[u8]) -> Result<Self, ValueError> {
        let bad = |_| ValueError::new(format!("invalid AES key size {}", key.len()));
        Ok(Self(match key.len() {
            16 => GcmKey::K128(AesGcm::new_from_slice(key).map_err(bad)?),
            24 => GcmKey::K192(AesGcm::new_from_slice(key).map_err(bad)?),
            32 => GcmKey::K256(AesGcm::new_from_slice(key).map_err(bad)?),
            n => return Err(ValueError::new(format!("invalid AES key size {n}"))),
        }))
    }

    /// Seals `data` under `nonce`, bound to `context`.
    pub(super) fn seal(&self, nonce: &[u8], data: &[u8], context: &[u8]) -> Result<Vec<u8>, ValueError> {
        let nonce = Nonce::from_slice(nonce);
        let payload = Payload { msg: data, aad: context };
        match &self.0 {
            GcmKey::K128(c) => c.encrypt(nonce, payload),
            GcmKey::K192(c) => c.encrypt(nonce, payload),
            GcmKey::K256(c) => c.encrypt(nonce, payload),
        }
        .map_err(|_| ValueError::new("AES-GCM encryption failed"))
    }

    pub(super) fn open(&self, nonce: &[u8], data: &[u8], context: &[u8]) -> Result<Vec<u8>, ValueError> {
        let nonce = Nonce::from_slice(nonce);
        let payload = Payload { msg: data, aad: context };
        match &self.0 {
            GcmKey::K128(c) => c.decrypt(nonce, payload),
            GcmKey::K192(c) => c.decrypt(nonce, payload),
            GcmKey::K256(c) => c.decrypt(nonce, payload),
        }
        .map_err(|_| ValueError::new("cipher: message authentication failed"))
    }
}

impl Transform for Gcm {
    fn transform_from_storage(&self, data: &[u8], context: &[u8]) -> Result<Vec<u8>, ValueError> {
        // The nonce and the 16-byte tag at least.
        if data.len() < GCM_NONCE + 16 {
            return Err(ValueError::new("the stored data was shorter than the required size"));
        }
        let (nonce, sealed) = data.split_at(GCM_NONCE);
        self.open(nonce, sealed, context)
    }

    fn transform_to_storage(&self, data: &[u8], context: &[u8]) -> Result<Vec<u8>, ValueError> {
        let mut nonce = [0u8; GCM_NONCE];
        rand::rng().fill_bytes(&mut nonce);
        let sealed = self.seal(&nonce, data, context)?;
        Ok([&nonce[..], &sealed].concat())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cbc_round_trips_every_key_size_and_length() {
        for size in [16, 24, 32] {
            let t = Cbc::new(&vec![7u8; size]).unwrap();
            for len in [0, 1, 15, 16, 17, 1000] {
                let plain = vec![b'x'; len];
                let stored = t.transform_to_storage(&plain, b"k").unwrap();
                assert_eq!(stored.len(), BLOCK + (len / BLOCK + 1) * BLOCK);
                assert_eq!(t.transform_from_storage(&stored, b"k").unwrap(), plain);
            }
        }
    }

    #[test]
    fn cbc_refuses_short_unaligned_and_badly_padded_values() {
        let t = Cbc::new(&[1u8; 32]).unwrap();
        let other = Cbc::new(&[2u8; 32]).unwrap();
        let err = |r: Result<Vec<u8>, ValueError>| r.unwrap_err().to_string();
        assert_eq!(err(t.transform_from_storage(b"short", b"")), "the stored data was shorter than the required size");
        assert_eq!(
            err(t.transform_from_storage(&[0u8; 20], b"")),
            "the stored data is not a multiple of the block size"
        );
        // A wrong key almost always leaves invalid padding; when it does not, the bytes are not the plaintext.
        let plain = b"{\"secret\":1}";
        let reads = (0..64).map(|_| t.transform_from_storage(&other.transform_to_storage(plain, b"").unwrap(), b""));
        let refused = reads.filter(|r| match r {
            Ok(bytes) => {
                assert_ne!(bytes, plain);
                false
            }
            Err(e) => {
                ["invalid padding on input", "invalid PKCS7 data (empty or not padded)"].contains(&&*e.to_string())
            }
        });
        assert!(refused.count() > 40);
    }

    #[test]
    fn gcm_binds_the_value_to_its_key() {
        for size in [16, 24, 32] {
            let t = Gcm::new(&vec![3u8; size]).unwrap();
            let stored = t.transform_to_storage(b"plain", b"/widgets/a/b").unwrap();
            assert_eq!(stored.len(), GCM_NONCE + 5 + 16);
            assert_eq!(t.transform_from_storage(&stored, b"/widgets/a/b").unwrap(), b"plain");
            let moved = t.transform_from_storage(&stored, b"/widgets/a/c").unwrap_err();
            assert_eq!(moved.to_string(), "cipher: message authentication failed");
        }
        assert!(Gcm::new(&[0u8; 8]).is_err());
    }

    #[test]
    fn every_write_draws_a_new_iv() {
        let (cbc, gcm) = (Cbc::new(&[9u8; 16]).unwrap(), Gcm::new(&[9u8; 16]).unwrap());
        assert_ne!(cbc.transform_to_storage(b"same", b"").unwrap(), cbc.transform_to_storage(b"same", b"").unwrap());
        assert_ne!(gcm.transform_to_storage(b"same", b"").unwrap(), gcm.transform_to_storage(b"same", b"").unwrap());
    }
}
