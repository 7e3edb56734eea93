//! A test PKI (an rcgen CA) and TLS servers on loopback addresses standing in for pods:
//! hyper over tokio-rustls, HTTP/1 and HTTP/2 (ALPN), answering plain HTTP with
//! `<cluster> <addr> <authority> <sni>` and `loyalty.Accrual/Accrue` over gRPC, and recording
//! every handshake.
#![allow(dead_code, unreachable_pub)]

use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::pin::Pin;
use std::sync::{Arc, Mutex};
use std::task::{Context, Poll};

use bytes::Bytes;
use http::{Request, Response};
use http_body_util::{BodyExt, Full};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo};
use hyper_util::server::conn::auto;
use rcgen::{
    BasicConstraints, CertificateParams, DnType, ExtendedKeyUsagePurpose, IsCa, Issuer, KeyPair,
    KeyUsagePurpose,
};
use rustls::pki_types::{CertificateDer, PrivateKeyDer, PrivatePkcs8KeyDer};
use rustls::server::WebPkiClientVerifier;
use rustls::{ClientConfig, RootCertStore, ServerConfig};
use tokio::net::TcpListener;
use tokio::sync::watch;
use tokio_rustls::TlsAcceptor;
use tonic::Status;
use tonic::body::Body as GrpcBody;
use tonic::codec::{Codec, DecodeBuf, Decoder, EncodeBuf, Encoder};
use tonic::server::NamedService;

pub fn provider() -> Arc<rustls::crypto::CryptoProvider> {
    Arc::new(rustls::crypto::ring::default_provider())
}

/// A certificate chain and its key.
#[derive(Clone)]
pub struct Identity {
    pub chain: Vec<CertificateDer<'static>>,
    key: Vec<u8>,
}

impl Identity {
    pub fn key(&self) -> PrivateKeyDer<'static> {
        PrivateKeyDer::Pkcs8(PrivatePkcs8KeyDer::from(self.key.clone()))
    }

    /// The leaf certificate.
    pub fn leaf(&self) -> &CertificateDer<'static> {
        &self.chain[0]
    }
}

/// A certificate authority made for one test.
pub struct Ca {
    issuer: Issuer<'static, KeyPair>,
    cert: CertificateDer<'static>,
    pem: String,
}

impl Ca {
    pub fn new(name: &str) -> Self {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.is_ca = IsCa::Ca(BasicConstraints::Unconstrained);
        params.key_usages = vec![KeyUsagePurpose::KeyCertSign, KeyUsagePurpose::CrlSign];
        let key = KeyPair::generate().unwrap();
        let cert = params.self_signed(&key).unwrap();
        Self {
            issuer: Issuer::new(params, key),
            cert: cert.der().clone(),
            pem: cert.pem(),
        }
    }

    /// The CA certificate, PEM.
    pub fn pem(&self) -> String {
        self.pem.clone()
    }

    /// A server certificate for these DNS names.
    pub fn server(&self, names: &[&str]) -> Identity {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        self.sign(params)
    }

    /// A server certificate for these DNS names that expired on 1 January 2020.
    pub fn expired_server(&self, names: &[&str]) -> Identity {
        let mut params =
            CertificateParams::new(names.iter().map(|n| n.to_string()).collect::<Vec<_>>())
                .unwrap();
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ServerAuth];
        params.not_before = rcgen::date_time_ymd(2019, 1, 1);
        params.not_after = rcgen::date_time_ymd(2020, 1, 1);
        self.sign(params)
    }

    /// A client certificate with this common name.
    pub fn client(&self, name: &str) -> Identity {
        let mut params = CertificateParams::new(Vec::<String>::new()).unwrap();
        params.distinguished_name.push(DnType::CommonName, name);
        params.extended_key_usages = vec![ExtendedKeyUsagePurpose::ClientAuth];
        self.sign(params)
    }

    fn sign(&self, params: CertificateParams) -> Identity {
        let key = KeyPair::generate().unwrap();
        let cert = params.signed_by(&key, &self.issuer).unwrap();
        Identity {
            chain: vec![cert.der().clone()],
            key: key.serialize_der(),
        }
    }

    pub fn roots(&self) -> RootCertStore {
        let mut roots = RootCertStore::empty();
        roots.add(self.cert.clone()).unwrap();
        roots
    }

    /// A client configuration trusting this CA, with `identity` as its client certificate
    /// (mTLS) if given, offering `alpn`.
    pub fn client_config(&self, identity: Option<&Identity>, alpn: &[&[u8]]) -> ClientConfig {
        self.client_config_for(identity, alpn, rustls::DEFAULT_VERSIONS)
    }

    /// [`Ca::client_config`] speaking only these TLS versions.
    pub fn client_config_for(
        &self,
        identity: Option<&Identity>,
        alpn: &[&[u8]],
        versions: &[&'static rustls::SupportedProtocolVersion],
    ) -> ClientConfig {
        let builder = ClientConfig::builder_with_provider(provider())
            .with_protocol_versions(versions)
            .unwrap()
            .with_root_certificates(self.roots());
        let mut config = match identity {
            Some(id) => builder
                .with_client_auth_cert(id.chain.clone(), id.key())
                .unwrap(),
            None => builder.with_no_client_auth(),
        };
        config.alpn_protocols = alpn.iter().map(|p| p.to_vec()).collect();
        config
    }
}

/// What a server saw of one TLS handshake.
#[derive(Clone, Debug)]
pub struct Handshake {
    /// The SNI the client sent.
    pub sni: Option<String>,
    /// The client's certificate (mTLS).
    pub client_cert: Option<CertificateDer<'static>>,
    /// The negotiated ALPN protocol.
    pub alpn: Option<Vec<u8>>,
}

/// How a server handles TLS.
pub struct ServerTls {
    pub identity: Identity,
    /// Client certificates are required and verified against this CA.
    pub client_ca: Option<RootCertStore>,
    /// Every response closes its connection, so every request makes a new one.
    pub close_each: bool,
}

/// A TLS server on one loopback address.
pub struct TlsServer {
    pub addr: SocketAddr,
    pub cluster: String,
    /// TCP connections accepted (handshakes attempted).
    accepted: Arc<watch::Sender<usize>>,
    /// Connections open now.
    open: Arc<watch::Sender<usize>>,
    handshakes: Arc<Mutex<Vec<Handshake>>>,
    stop: watch::Sender<bool>,
    task: tokio::task::JoinHandle<()>,
}

impl TlsServer {
    pub async fn start(addr: SocketAddr, cluster: &str, tls: ServerTls) -> Self {
        let listener = TcpListener::bind(addr)
            .await
            .expect("bind loopback address");
        let addr = listener.local_addr().unwrap();
        let verifier = match tls.client_ca {
            Some(roots) => WebPkiClientVerifier::builder_with_provider(Arc::new(roots), provider())
                .build()
                .unwrap(),
            None => WebPkiClientVerifier::no_client_auth(),
        };
        let mut config = ServerConfig::builder_with_provider(provider())
            .with_safe_default_protocol_versions()
            .unwrap()
            .with_client_cert_verifier(verifier)
            .with_single_cert(tls.identity.chain.clone(), tls.identity.key())
            .unwrap();
        config.alpn_protocols = vec![b"h2".to_vec(), b"http/1.1".to_vec()];
        let acceptor = TlsAcceptor::from(Arc::new(config));
        let accepted = Arc::new(watch::Sender::new(0usize));
        let open = Arc::new(watch::Sender::new(0usize));
        let handshakes = Arc::new(Mutex::new(Vec::new()));
        let (stop, mut stopped) = watch::channel(false);
        let close_each = tls.close_each;
        let prefix = format!("{cluster} {addr}");
        let task = {
            let (accepted, open, handshakes) = (
                Arc::clone(&accepted),
                Arc::clone(&open),
                Arc::clone(&handshakes),
            );
            tokio::spawn(async move {
                let mut conns = tokio::task::JoinSet::new();
                loop {
                    tokio::select! {
                        got = listener.accept() => {
                            let Ok((tcp, _)) = got else { continue };
                            // As servers do (tonic's by default): no Nagle delay on answers.
                            let _ = tcp.set_nodelay(true);
                            accepted.send_modify(|n| *n += 1);
                            let guard = Open::new(Arc::clone(&open));
                            let (acceptor, handshakes, prefix) =
                                (acceptor.clone(), Arc::clone(&handshakes), prefix.clone());
                            let mut stopped = stopped.clone();
                            conns.spawn(async move {
                                let _guard = guard;
                                let Ok(stream) = acceptor.accept(tcp).await else { return };
                                let (_, session) = stream.get_ref();
                                let seen = Handshake {
                                    sni: session.server_name().map(str::to_owned),
                                    client_cert: session
                                        .peer_certificates()
                                        .and_then(|c| c.first().cloned()),
                                    alpn: session.alpn_protocol().map(<[u8]>::to_vec),
                                };
                                let sni = seen.sni.clone().unwrap_or_default();
                                handshakes.lock().unwrap().push(seen);
                                let svc = hyper::service::service_fn(move |req: Request<Incoming>| {
                                    respond(req, prefix.clone(), sni.clone(), close_each)
                                });
                                let builder = auto::Builder::new(TokioExecutor::new());
                                let conn = builder.serve_connection(TokioIo::new(stream), svc);
                                tokio::pin!(conn);
                                tokio::select! {
                                    _ = conn.as_mut() => {}
                                    _ = wait_stop(&mut stopped) => {
                                        conn.as_mut().graceful_shutdown();
                                        let _ = conn.await;
                                    }
                                }
                            });
                        }
                        _ = wait_stop(&mut stopped) => break,
                    }
                }
                drop(listener);
                while conns.join_next().await.is_some() {}
            })
        };
        Self {
            addr,
            cluster: cluster.to_owned(),
            accepted,
            open,
            handshakes,
            stop,
            task,
        }
    }

    pub fn endpoint(&self) -> mcs_core::discovery::Endpoint {
        mcs_core::discovery::Endpoint::ready(
            self.addr,
            mcs_core::ClusterId::new(&self.cluster).unwrap(),
        )
    }

    /// TCP connections accepted so far.
    pub fn accepted(&self) -> usize {
        *self.accepted.borrow()
    }

    /// Connections open now.
    pub fn open_connections(&self) -> usize {
        *self.open.borrow()
    }

    /// Waits until the number of open connections satisfies `f`.
    pub async fn wait_connections(&self, f: impl FnMut(&usize) -> bool) {
        let mut rx = self.open.subscribe();
        let _ = rx.wait_for(f).await;
    }

    /// The handshakes that completed, in order.
    pub fn handshakes(&self) -> Vec<Handshake> {
        self.handshakes.lock().unwrap().clone()
    }

    pub async fn stop(self) {
        let _ = self.stop.send(true);
        let _ = self.task.await;
    }
}

async fn wait_stop(rx: &mut watch::Receiver<bool>) {
    let _ = rx.wait_for(|s| *s).await;
}

/// Counts a connection open until dropped.
struct Open(Arc<watch::Sender<usize>>);

impl Open {
    fn new(open: Arc<watch::Sender<usize>>) -> Self {
        open.send_modify(|n| *n += 1);
        Self(open)
    }
}

impl Drop for Open {
    fn drop(&mut self) {
        self.0.send_modify(|n| *n -= 1);
    }
}

type BoxBody = http_body_util::combinators::UnsyncBoxBody<Bytes, Status>;

/// HTTP: `<cluster> <addr> <authority> <sni>`; gRPC `loyalty.Accrual/Accrue`: the same.
async fn respond(
    req: Request<Incoming>,
    prefix: String,
    sni: String,
    close_each: bool,
) -> Result<Response<BoxBody>, Infallible> {
    // HTTP/1: the Host header; HTTP/2: :authority (hyper puts it in the URI).
    let authority = req
        .uri()
        .authority()
        .map(|a| a.to_string())
        .or_else(|| {
            req.headers()
                .get(http::header::HOST)
                .and_then(|h| h.to_str().ok())
                .map(str::to_owned)
        })
        .unwrap_or_default();
    let answer = format!("{prefix} {authority} {sni}");
    if req.uri().path().starts_with("/loyalty.Accrual/") {
        let routes = tonic::service::Routes::new(Accrual { answer });
        let response = tower::ServiceExt::oneshot(routes, req)
            .await
            .unwrap_or_else(|e| match e {});
        return Ok(response.map(|b| b.boxed_unsync()));
    }
    let _ = req.into_body().collect().await;
    let mut response = Response::new(
        Full::new(Bytes::from(answer))
            .map_err(|e| match e {})
            .boxed_unsync(),
    );
    if close_each {
        response
            .headers_mut()
            .insert(http::header::CONNECTION, "close".parse().unwrap());
    }
    Ok(response)
}

/// Reads an answer: `(cluster, addr, authority, sni)`.
pub fn parse_answer(text: &str) -> (String, SocketAddr, String, String) {
    let mut parts = text.split(' ');
    let cluster = parts.next().unwrap().to_owned();
    let addr = parts.next().unwrap().parse().unwrap();
    let authority = parts.next().unwrap_or_default().to_owned();
    let sni = parts.next().unwrap_or_default().to_owned();
    (cluster, addr, authority, sni)
}

/// Messages are raw bytes.
#[derive(Clone, Copy, Default)]
pub struct RawCodec;

impl Codec for RawCodec {
    type Encode = Vec<u8>;
    type Decode = Vec<u8>;
    type Encoder = RawCodec;
    type Decoder = RawCodec;

    fn encoder(&mut self) -> Self::Encoder {
        RawCodec
    }

    fn decoder(&mut self) -> Self::Decoder {
        RawCodec
    }
}

impl Encoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn encode(&mut self, item: Vec<u8>, dst: &mut EncodeBuf<'_>) -> Result<(), Status> {
        bytes::BufMut::put_slice(dst, &item);
        Ok(())
    }
}

impl Decoder for RawCodec {
    type Item = Vec<u8>;
    type Error = Status;

    fn decode(&mut self, src: &mut DecodeBuf<'_>) -> Result<Option<Vec<u8>>, Status> {
        use bytes::Buf;
        Ok(Some(src.copy_to_bytes(src.remaining()).to_vec()))
    }
}

/// `loyalty.Accrual/Accrue`, answering with the server's answer line.
#[derive(Clone)]
struct Accrual {
    answer: String,
}

impl NamedService for Accrual {
    const NAME: &'static str = "loyalty.Accrual";
}

impl tower::Service<Request<GrpcBody>> for Accrual {
    type Response = Response<GrpcBody>;
    type Error = Infallible;
    type Future = Pin<Box<dyn Future<Output = Result<Self::Response, Infallible>> + Send>>;

    fn poll_ready(&mut self, _: &mut Context<'_>) -> Poll<Result<(), Infallible>> {
        Poll::Ready(Ok(()))
    }

    fn call(&mut self, req: Request<GrpcBody>) -> Self::Future {
        let answer = self.answer.clone();
        Box::pin(async move {
            let handler = tower::service_fn(move |_: tonic::Request<Vec<u8>>| {
                let answer = answer.clone();
                async move { Ok::<_, Status>(tonic::Response::new(answer.into_bytes())) }
            });
            Ok(tonic::server::Grpc::new(RawCodec).unary(handler, req).await)
        })
    }
}
