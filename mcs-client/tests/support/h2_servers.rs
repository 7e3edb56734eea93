//! HTTP/2 servers that do not process requests: one refuses every stream, one answers
//! with a GOAWAY. Written on the `h2` crate or frame by frame, so a test controls exactly
//! what the client reads.

use std::io;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;
use std::sync::atomic::{AtomicUsize, Ordering};

use tokio::io::{AsyncReadExt, AsyncWriteExt};
use tokio::net::{TcpListener, TcpStream};
use tokio::sync::oneshot;

use super::HOST;

/// An HTTP/2 server on `ip` that refuses every stream; counts the streams it refused.
pub async fn refusing_server(ip: IpAddr) -> (SocketAddr, Arc<AtomicUsize>) {
    let listener = TcpListener::bind(SocketAddr::new(ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&seen);
    tokio::spawn(async move {
        while let Ok((socket, _)) = listener.accept().await {
            let counter = Arc::clone(&counter);
            tokio::spawn(async move {
                let Ok(mut conn) = h2::server::handshake(socket).await else {
                    return;
                };
                while let Some(Ok((_request, mut respond))) = conn.accept().await {
                    counter.fetch_add(1, Ordering::SeqCst);
                    respond.send_reset(h2::Reason::REFUSED_STREAM);
                }
            });
        }
    });
    (addr, seen)
}

/// A server on `ip` that reads each connection up to the end of the first request (stream
/// 1), sends its SETTINGS, then either a GOAWAY saying it processed no stream (last stream
/// id 0), or, with `answer`, a complete 200 response to stream 1 and a GOAWAY with last
/// stream id 1; then, with `reset`, resets the connection (`SO_LINGER` 0), or else keeps it
/// open until the client closes it. Counts the requests it saw; the receiver fires after
/// the first GOAWAY was written (and the connection reset, with `reset`).
pub async fn go_away_server(
    ip: IpAddr,
    answer: bool,
    reset: bool,
) -> (SocketAddr, Arc<AtomicUsize>, oneshot::Receiver<()>) {
    let listener = TcpListener::bind(SocketAddr::new(ip, 0)).await.unwrap();
    let addr = listener.local_addr().unwrap();
    let seen = Arc::new(AtomicUsize::new(0));
    let counter = Arc::clone(&seen);
    let (written_tx, written) = oneshot::channel();
    tokio::spawn(async move {
        let mut written_tx = Some(written_tx);
        while let Ok((mut socket, _)) = listener.accept().await {
            if read_first_request(&mut socket).await.is_err() {
                continue;
            }
            counter.fetch_add(1, Ordering::SeqCst);
            // SETTINGS (empty).
            let mut frames = vec![0, 0, 0, 0x4, 0, 0, 0, 0, 0];
            let mut last_stream = 0u8;
            if answer {
                // HEADERS on stream 1, END_HEADERS: `:status: 200` (HPACK static index 8).
                frames.extend_from_slice(&[0, 0, 1, 0x1, 0x4, 0, 0, 0, 1, 0x88]);
                // DATA on stream 1, END_STREAM: the test servers' "<cluster> <addr> <host>".
                let body = format!("east {addr} {HOST}");
                let len = u8::try_from(body.len()).unwrap();
                frames.extend_from_slice(&[0, 0, len, 0x0, 0x1, 0, 0, 0, 1]);
                frames.extend_from_slice(body.as_bytes());
                last_stream = 1;
            }
            // GOAWAY: last stream id, NO_ERROR.
            frames.extend_from_slice(&[
                0,
                0,
                8,
                0x7,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                0,
                last_stream,
                0,
                0,
                0,
                0,
            ]);
            socket.write_all(&frames).await.unwrap();
            if reset {
                socket.set_zero_linger().unwrap();
                drop(socket);
            } else {
                tokio::spawn(async move {
                    // Read (and drop) until the client closes the connection.
                    let mut sink = [0u8; 1024];
                    while matches!(socket.read(&mut sink).await, Ok(n) if n > 0) {}
                });
            }
            if let Some(tx) = written_tx.take() {
                let _ = tx.send(());
            }
        }
    });
    (addr, seen, written)
}

/// Reads the client preface and frames up to the end of the first request (a HEADERS or
/// DATA frame with END_STREAM), so that the client has nothing left to write for it: its
/// next write is the next request's.
pub async fn read_first_request(socket: &mut TcpStream) -> io::Result<()> {
    const DATA: u8 = 0x0;
    const HEADERS: u8 = 0x1;
    const END_STREAM: u8 = 0x1;
    let mut preface = [0u8; 24];
    socket.read_exact(&mut preface).await?;
    loop {
        let mut header = [0u8; 9];
        socket.read_exact(&mut header).await?;
        let len = u32::from_be_bytes([0, header[0], header[1], header[2]]) as usize;
        let mut payload = vec![0u8; len];
        socket.read_exact(&mut payload).await?;
        if matches!(header[3], DATA | HEADERS) && header[4] & END_STREAM != 0 {
            return Ok(());
        }
    }
}
