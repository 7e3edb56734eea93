//! DNS over UDP without a task per query.
//!
//! hickory-server's UDP path spawns a task for every datagram and hands each answer back
//! to the socket's task through a channel: two task switches per query, which under load
//! cost about as much as answering. Here each socket has one loop that receives a query,
//! answers it through the same [`Handler`] and sends the answer itself before it receives
//! the next. Answering never waits on anything but the send (the zone is read under a
//! short lock), so one loop per socket, and a socket per core ([`super::DnsConfig::udp_sockets`],
//! `SO_REUSEPORT`), keeps the cores busy. TCP stays on hickory-server.
//!
//! What hickory-server does before its handler runs is done here alike: datagrams shorter
//! than a header and responses (QR set) are dropped, so are sources that cannot be
//! answered (port 0, unspecified or broadcast addresses); a message whose header parses
//! but whose body does not gets FORMERR. Answers are encoded as hickory-server encodes
//! them: at most the requester's EDNS size (512 without EDNS), truncated with the TC bit
//! past it, and SERVFAIL when a record cannot be encoded.

use std::net::SocketAddr;
use std::sync::Arc;

use hickory_server::net::NetError;
use hickory_server::net::runtime::TokioTime;
use hickory_server::net::xfer::Protocol;
use hickory_server::proto::op::{
    Header, HeaderCounts, MessageType, Metadata, OpCode, ResponseCode,
};
use hickory_server::proto::rr::Record;
use hickory_server::proto::serialize::binary::{
    BinDecodable, BinDecoder, BinEncodable, BinEncoder,
};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::MessageResponse;
use tokio::net::UdpSocket;

use super::handler::Handler;

/// The largest query read; a longer datagram is cut there and so fails to parse (FORMERR).
const MAX_QUERY: usize = 4096;

/// Answers the queries that reach `socket` until the task is dropped, or returns the
/// error that leaves the socket unusable.
pub(super) async fn serve(socket: UdpSocket, handler: Handler) -> std::io::Error {
    let socket = Arc::new(socket);
    let mut buf = vec![0u8; MAX_QUERY];
    loop {
        let (len, src) = match socket.recv_from(&mut buf).await {
            Ok(received) => received,
            // As hickory-server judges a UDP socket's errors: these end it.
            Err(e)
                if matches!(
                    e.kind(),
                    std::io::ErrorKind::NotConnected | std::io::ErrorKind::ConnectionAborted
                ) =>
            {
                return e;
            }
            Err(e) => {
                // ICMP errors of earlier sends surface here on some systems; the socket
                // itself stays usable.
                tracing::debug!(error = %e, "UDP receive failed");
                continue;
            }
        };
        if !answerable(src) {
            tracing::debug!(%src, "dropped a UDP query from an address that cannot be answered");
            continue;
        }
        let bytes = &buf[..len];
        let Ok(header) = Header::read(&mut BinDecoder::new(bytes)) else {
            continue; // shorter than a header
        };
        let responder = Responder {
            socket: Arc::clone(&socket),
            dst: src,
        };
        match Request::from_bytes(bytes.to_vec(), src, Protocol::Udp) {
            Ok(request) if request.metadata.message_type == MessageType::Response => {}
            Ok(request) => {
                handler
                    .handle_request::<_, TokioTime>(&request, responder)
                    .await;
            }
            Err(e) => {
                tracing::debug!(%src, error = %e, "malformed DNS query over UDP");
                handler.send_format_error(&header.metadata, responder).await;
            }
        }
    }
}

/// Whether an answer can be sent to `src` (as hickory-server checks).
fn answerable(src: SocketAddr) -> bool {
    src.port() != 0
        && match src {
            SocketAddr::V4(v4) => !v4.ip().is_unspecified() && !v4.ip().is_broadcast(),
            SocketAddr::V6(v6) => !v6.ip().is_unspecified(),
        }
}

/// Sends one answer from the socket the query came in on.
#[derive(Clone)]
struct Responder {
    socket: Arc<UdpSocket>,
    dst: SocketAddr,
}

#[async_trait::async_trait]
impl ResponseHandler for Responder {
    /// Encodes `response` within the requester's UDP size (its EDNS payload, or 512 bytes
    /// without EDNS; what does not fit is left out and the TC bit set), SERVFAIL when it
    /// cannot be encoded, and sends it.
    async fn send_response<'a>(
        &mut self,
        response: MessageResponse<
            '_,
            'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
            impl Iterator<Item = &'a Record> + Send + 'a,
        >,
    ) -> Result<ResponseInfo, NetError> {
        let id = response.metadata().id;
        let limit = response.edns().map_or(512, |e| e.max_payload());
        let mut bytes = Vec::with_capacity(512);
        let mut encoder = BinEncoder::new(&mut bytes);
        encoder.set_max_size(limit);
        let info = match response.destructive_emit(&mut encoder) {
            Ok(info) => info,
            Err(e) => {
                tracing::error!(error = %e, id, "cannot encode a DNS answer; sending SERVFAIL");
                bytes.clear();
                let mut metadata = Metadata::new(id, MessageType::Response, OpCode::Query);
                metadata.response_code = ResponseCode::ServFail;
                let header = Header {
                    metadata,
                    counts: HeaderCounts::default(),
                };
                let mut encoder = BinEncoder::new(&mut bytes);
                header.emit(&mut encoder)?;
                ResponseInfo::from(header)
            }
        };
        self.socket.send_to(&bytes, self.dst).await?;
        Ok(info)
    }
}
