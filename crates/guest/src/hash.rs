//! The streams' checksum, shared by `domus-guest` and the host's tests
//! (which send or read the other end).

/// FNV-1a over 8-byte words (the tail zero-padded), seeded by the length:
/// cheap enough for 100 MiB in a guest, and any change of a byte, of the
/// order or of the length changes it.
#[derive(Default)]
pub struct Hash {
    h: u64,
    len: u64,
    tail: Vec<u8>,
}

impl Hash {
    pub fn update(&mut self, mut data: &[u8]) {
        self.len += data.len() as u64;
        if !self.tail.is_empty() {
            let need = 8 - self.tail.len();
            let take = need.min(data.len());
            self.tail.extend_from_slice(&data[..take]);
            data = &data[take..];
            if self.tail.len() == 8 {
                let w = u64::from_le_bytes(self.tail[..].try_into().unwrap_or([0; 8]));
                self.word(w);
                self.tail.clear();
            }
        }
        let mut words = data.chunks_exact(8);
        for w in &mut words {
            self.word(u64::from_le_bytes(w.try_into().unwrap_or([0; 8])));
        }
        self.tail.extend_from_slice(words.remainder());
    }

    fn word(&mut self, w: u64) {
        if self.h == 0 {
            self.h = 0xcbf2_9ce4_8422_2325;
        }
        self.h = (self.h ^ w).wrapping_mul(0x100_0000_01b3);
    }

    pub fn finish(mut self) -> u64 {
        let mut last = [0u8; 8];
        last[..self.tail.len()].copy_from_slice(&self.tail);
        if !self.tail.is_empty() {
            self.word(u64::from_le_bytes(last));
        }
        self.word(self.len);
        self.h
    }
}
