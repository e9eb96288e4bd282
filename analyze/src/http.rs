//! Recognising plaintext HTTP/1.x from the first bytes of a request or response.

const METHODS: [&str; 9] = [
    "GET", "POST", "HEAD", "PUT", "DELETE", "OPTIONS", "PATCH", "CONNECT", "TRACE",
];

/// The request method, when `prefix` starts an HTTP/1.x request line.
pub(crate) fn request_method(prefix: &[u8]) -> Option<&'static str> {
    METHODS.into_iter().find(|m| {
        prefix.len() > m.len() && prefix.starts_with(m.as_bytes()) && prefix[m.len()] == b' '
    })
}

/// The status code, when `prefix` starts an HTTP/1.x status line (`HTTP/1.1 200 ...`).
pub(crate) fn response_status(prefix: &[u8]) -> Option<u16> {
    if prefix.len() < 12 || !prefix.starts_with(b"HTTP/1.") || prefix[8] != b' ' {
        return None;
    }
    let d = &prefix[9..12];
    if !d.iter().all(u8::is_ascii_digit) {
        return None;
    }
    let code = (d[0] - b'0') as u16 * 100 + (d[1] - b'0') as u16 * 10 + (d[2] - b'0') as u16;
    (100..600).contains(&code).then_some(code)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn recognises() {
        assert_eq!(request_method(b"GET / HTTP/1.1\r\n"), Some("GET"));
        assert_eq!(request_method(b"POSTMAN"), None);
        assert_eq!(request_method(b"\x16\x03\x01"), None);
        assert_eq!(response_status(b"HTTP/1.1 404 Not Found"), Some(404));
        assert_eq!(response_status(b"HTTP/1.0 200 OK"), Some(200));
        assert_eq!(response_status(b"HTTP/2 200"), None);
        assert_eq!(response_status(b"HTTP/1.1 9xx"), None);
    }
}
