//! The preamble at the start of every replayed request: it tells the server emulator which
//! original connection and exchange the request belongs to and what to answer, so the server
//! needs no copy of the workload. The rest of the request is filler up to the recorded size
//! (a request smaller than the preamble is sent at the preamble's size).

pub const MAGIC: [u8; 4] = *b"MIMQ";
pub const VERSION: u8 = 1;
pub const LEN: usize = 52;

/// What the server does after its response.
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum After {
    /// Wait for the next request (or the client's close).
    Stay,
    /// Close with FIN.
    Fin,
    /// Close with RST.
    Rst,
}

#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub struct Preamble {
    pub conn_id: u64,
    pub seq: u32,
    pub after: After,
    /// Total request size including the preamble (at least [`LEN`]).
    pub req_bytes: u64,
    pub resp_bytes: u64,
    pub header_bytes: u64,
    pub response_delay_us: u32,
    pub query_delay_us: u32,
}

#[derive(Debug, PartialEq, Eq, thiserror::Error)]
pub enum PreambleError {
    #[error("request does not start with the mimic preamble")]
    BadMagic,
    #[error("preamble version {0}, this server speaks {VERSION}")]
    Version(u8),
    #[error("inconsistent preamble: {0}")]
    Inconsistent(&'static str),
}

impl Preamble {
    pub fn encode(&self) -> [u8; LEN] {
        let mut b = [0u8; LEN];
        b[0..4].copy_from_slice(&MAGIC);
        b[4] = VERSION;
        b[5] = match self.after {
            After::Stay => 0,
            After::Fin => 1,
            After::Rst => 2,
        };
        b[8..16].copy_from_slice(&self.conn_id.to_be_bytes());
        b[16..20].copy_from_slice(&self.seq.to_be_bytes());
        b[20..28].copy_from_slice(&self.req_bytes.max(LEN as u64).to_be_bytes());
        b[28..36].copy_from_slice(&self.resp_bytes.to_be_bytes());
        b[36..44].copy_from_slice(&self.header_bytes.min(self.resp_bytes).to_be_bytes());
        b[44..48].copy_from_slice(&self.response_delay_us.to_be_bytes());
        b[48..52].copy_from_slice(&self.query_delay_us.to_be_bytes());
        b
    }

    pub fn decode(b: &[u8; LEN]) -> Result<Preamble, PreambleError> {
        if b[0..4] != MAGIC {
            return Err(PreambleError::BadMagic);
        }
        if b[4] != VERSION {
            return Err(PreambleError::Version(b[4]));
        }
        let u64_at = |i: usize| u64::from_be_bytes(b[i..i + 8].try_into().expect("8 bytes"));
        let u32_at = |i: usize| u32::from_be_bytes(b[i..i + 4].try_into().expect("4 bytes"));
        let after = match b[5] {
            0 => After::Stay,
            1 => After::Fin,
            2 => After::Rst,
            _ => return Err(PreambleError::Inconsistent("unknown close mode")),
        };
        let p = Preamble {
            conn_id: u64_at(8),
            seq: u32_at(16),
            after,
            req_bytes: u64_at(20),
            resp_bytes: u64_at(28),
            header_bytes: u64_at(36),
            response_delay_us: u32_at(44),
            query_delay_us: u32_at(48),
        };
        if p.req_bytes < LEN as u64 {
            return Err(PreambleError::Inconsistent(
                "request shorter than its preamble",
            ));
        }
        if p.header_bytes > p.resp_bytes {
            return Err(PreambleError::Inconsistent(
                "header larger than the response",
            ));
        }
        // a replay never asks for more than 64 GiB or waits more than an hour
        if p.resp_bytes > 1 << 36
            || p.req_bytes > 1 << 36
            || p.response_delay_us > 3_600_000_000
            || p.query_delay_us > 3_600_000_000
        {
            return Err(PreambleError::Inconsistent("size or delay out of range"));
        }
        Ok(p)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_rejects() {
        let p = Preamble {
            conn_id: 123456789,
            seq: 7,
            after: After::Rst,
            req_bytes: 500,
            resp_bytes: 20_000,
            header_bytes: 1_200,
            response_delay_us: 3_000,
            query_delay_us: 150_000,
        };
        let b = p.encode();
        assert_eq!(Preamble::decode(&b), Ok(p));
        // small requests are sent at the preamble's size
        let small = Preamble { req_bytes: 10, ..p }.encode();
        assert_eq!(Preamble::decode(&small).unwrap().req_bytes, LEN as u64);
        let mut bad = b;
        bad[0] = b'X';
        assert_eq!(Preamble::decode(&bad), Err(PreambleError::BadMagic));
        let mut v = b;
        v[4] = 9;
        assert_eq!(Preamble::decode(&v), Err(PreambleError::Version(9)));
        let mut h = b;
        h[36..44].copy_from_slice(&30_000u64.to_be_bytes());
        assert!(matches!(
            Preamble::decode(&h),
            Err(PreambleError::Inconsistent(_))
        ));
    }
}
