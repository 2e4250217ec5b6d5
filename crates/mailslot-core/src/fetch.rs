//! Reading an HTTP answer from another server within a bound, so a server that sends without
//! end costs at most that many bytes: an agent's discovery and key lookups at a relay, and a
//! relay's fetch of another relay's discovery document.

/// Why an answer's body was not read.
#[derive(Debug, thiserror::Error)]
pub enum BodyError {
    /// The connection failed while reading.
    #[error("{0}")]
    Read(#[from] reqwest::Error),
    /// The body is longer than the bound.
    #[error("the answer is over {0} bytes")]
    TooLarge(usize),
}

/// The body of `response`, at most `max` bytes.
pub async fn body(mut response: reqwest::Response, max: usize) -> Result<Vec<u8>, BodyError> {
    let mut body = Vec::new();
    while let Some(chunk) = response.chunk().await? {
        if body.len() + chunk.len() > max {
            return Err(BodyError::TooLarge(max));
        }
        body.extend_from_slice(&chunk);
    }
    Ok(body)
}

#[cfg(test)]
mod tests {
    use tokio::io::{AsyncReadExt, AsyncWriteExt};

    use super::*;

    /// A server on loopback that answers one request with `len` bytes, and its URL.
    async fn answering(len: usize) -> String {
        let listener = tokio::net::TcpListener::bind("127.0.0.1:0").await.unwrap();
        let url = format!("http://{}/", listener.local_addr().unwrap());
        tokio::spawn(async move {
            let (mut socket, _) = listener.accept().await.unwrap();
            let _ = socket.read(&mut [0u8; 4096]).await;
            let head =
                format!("HTTP/1.1 200 OK\r\ncontent-length: {len}\r\nconnection: close\r\n\r\n");
            let _ = socket.write_all(head.as_bytes()).await;
            let _ = socket.write_all(&vec![b'x'; len]).await;
        });
        url
    }

    #[tokio::test]
    async fn a_body_is_read_within_its_bound_and_refused_past_it() {
        let http = reqwest::Client::builder()
            .no_proxy()
            .tls_backend_preconfigured(crate::tls::http_tls(false).unwrap())
            .build()
            .unwrap();
        let within = http.get(answering(100).await).send().await.unwrap();
        assert_eq!(body(within, 100).await.unwrap(), vec![b'x'; 100]);
        let over = http.get(answering(101).await).send().await.unwrap();
        assert!(matches!(
            body(over, 100).await,
            Err(BodyError::TooLarge(100))
        ));
    }
}
