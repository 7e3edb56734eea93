//! Turns hickory requests into [`ZoneData::answer`] calls and answers back.
//!
//! hickory-server drops messages shorter than a header and messages with the QR bit set
//! (responses), and answers FORMERR to messages it cannot parse (including two OPT
//! records). Everything else reaches [`Handler`], which checks, in this order:
//! 1. EDNS version above 0: BADVERS, with an OPT record of version 0 (RFC 6891 6.1.3);
//! 2. an opcode other than QUERY (NOTIFY, UPDATE, STATUS, IQUERY, DSO, ...): NOTIMP;
//! 3. not exactly one question: FORMERR;
//! 4. a class other than IN: REFUSED (the zone exists only in class IN);
//! 5. the watches have not synced yet: SERVFAIL for names in the zone;
//! 6. otherwise [`ZoneData::answer`] (REFUSED outside the zone, NOTIMP for transfers).
//!
//! Every response to a request with an OPT record carries one.

use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, RwLock};

use hickory_server::net::runtime::Time;
use hickory_server::net::xfer::Protocol;
use hickory_server::proto::op::{Edns, Metadata, OpCode, ResponseCode};
use hickory_server::proto::rr::rdata::{A, AAAA, NS, SOA, SRV, TXT};
use hickory_server::proto::rr::{DNSClass, Name, RData, Record, RecordType};
use hickory_server::proto::serialize::binary::{BinDecoder, BinEncodable, BinEncoder};
use hickory_server::server::{Request, RequestHandler, ResponseHandler, ResponseInfo};
use hickory_server::zone_handler::{MessageResponseBuilder, Queries};
use mcs_core::dns::{self, Answer, QueryType, Rcode, ZoneData};

/// The codes the handler answers with; each has its counter registered up front.
const CODES: [ResponseCode; 7] = [
    ResponseCode::NoError,
    ResponseCode::FormErr,
    ResponseCode::ServFail,
    ResponseCode::NXDomain,
    ResponseCode::NotImp,
    ResponseCode::Refused,
    ResponseCode::BADVERS,
];

/// Counters of the DNS server: responses by response code, recorded as
/// [`DNS_RESPONSES`](crate::metrics::DNS_RESPONSES)`{rcode}` through the `metrics` facade
/// (registered with the recorder installed when the server is bound), and counted here
/// for [`DnsMetrics::responses`]. Cheap to clone.
#[derive(Clone, Debug)]
pub struct DnsMetrics(Arc<[RcodeCounter]>);

#[derive(Debug)]
struct RcodeCounter {
    code: ResponseCode,
    label: String,
    count: AtomicU64,
    counter: metrics::Counter,
}

impl Default for DnsMetrics {
    fn default() -> Self {
        Self(
            CODES
                .iter()
                .map(|code| {
                    let label = format!("{code:?}");
                    RcodeCounter {
                        code: *code,
                        counter: metrics::counter!(crate::metrics::DNS_RESPONSES, "rcode" => label.clone()),
                        label,
                        count: AtomicU64::new(0),
                    }
                })
                .collect(),
        )
    }
}

impl DnsMetrics {
    /// Responses sent so far with `rcode` (e.g. `NXDomain`).
    pub fn responses(&self, rcode: &str) -> u64 {
        self.0
            .iter()
            .find(|c| c.label == rcode)
            .map_or(0, |c| c.count.load(Ordering::Relaxed))
    }

    fn count(&self, code: ResponseCode) {
        // A linear scan of seven entries: cheaper than hashing the label.
        match self.0.iter().find(|c| c.code == code) {
            Some(c) => {
                c.count.fetch_add(1, Ordering::Relaxed);
                c.counter.increment(1);
            }
            None => {
                metrics::counter!(crate::metrics::DNS_RESPONSES, "rcode" => format!("{code:?}"))
                    .increment(1);
            }
        }
    }
}

#[derive(Clone)]
pub(super) struct Handler {
    data: Arc<RwLock<ZoneData>>,
    synced: Arc<AtomicBool>,
    metrics: DnsMetrics,
    /// The largest UDP response we send; EDNS offers it, and hickory truncates to it.
    max_udp_payload: u16,
}

impl Handler {
    pub(super) fn new(
        data: Arc<RwLock<ZoneData>>,
        synced: Arc<AtomicBool>,
        metrics: DnsMetrics,
        max_udp_payload: u16,
    ) -> Self {
        Self {
            data,
            synced,
            metrics,
            max_udp_payload,
        }
    }
}

#[async_trait::async_trait]
impl RequestHandler for Handler {
    async fn handle_request<R: ResponseHandler, T: Time>(
        &self,
        request: &Request,
        mut response: R,
    ) -> ResponseInfo {
        let resp_edns = request.edns.as_ref().map(|req| {
            let mut e = Edns::new();
            e.set_max_payload(req.max_payload().clamp(512, self.max_udp_payload));
            e.set_version(0);
            e
        });
        let mut builder = MessageResponseBuilder::from_message_request(request);
        if let Some(e) = resp_edns.as_ref() {
            builder.edns(e);
        }
        let error = |code: ResponseCode| (code, None::<Answer>);
        let (code, answer) = match request.request_info() {
            // The only EDNS version is 0; the OPT record of the answer says so.
            _ if request.edns.as_ref().is_some_and(|e| e.version() > 0) => {
                error(ResponseCode::BADVERS)
            }
            _ if request.metadata.op_code != OpCode::Query => error(ResponseCode::NotImp),
            Err(_) => error(ResponseCode::FormErr),
            Ok(info) if info.query.query_class() != DNSClass::IN => error(ResponseCode::Refused),
            Ok(info) => {
                let qname = info.query.original().name().to_string();
                let qtype = query_type(info.query.query_type());
                let synced = self.synced.load(Ordering::Acquire);
                // The read lock is held only while the answer is built, never across an await.
                // Before the first sync only names outside the zone have a sure answer
                // (REFUSED); the zone's names get SERVFAIL.
                let answer = self.data.read().ok().map(|data| {
                    (synced || !data.zone().contains(&qname)).then(|| data.answer(&qname, qtype))
                });
                // None: a poisoned lock means a watch handler panicked mid-update.
                let Some(Some(answer)) = answer else {
                    return self
                        .send_error(request, builder, ResponseCode::ServFail, response)
                        .await;
                };
                let code = match answer.rcode {
                    Rcode::NoError => ResponseCode::NoError,
                    Rcode::NxDomain => ResponseCode::NXDomain,
                    Rcode::Refused => ResponseCode::Refused,
                    _ => ResponseCode::NotImp,
                };
                (code, Some(answer))
            }
        };
        let Some(answer) = answer else {
            return self.send_error(request, builder, code, response).await;
        };
        let mut answers = to_records(&answer.answers);
        let mut authority = to_records(&answer.authority);
        let mut additionals = to_records(&answer.additionals);
        let mut metadata = Metadata::response_from_request(&request.metadata);
        metadata.response_code = code;
        metadata.authoritative = answer.authoritative;
        metadata.recursion_available = false;
        // An answer to an EDNS query keeps room for its OPT record: over UDP within the
        // payload size both sides offer, over TCP within a DNS message's largest size.
        if let Some(edns) = resp_edns.as_ref() {
            let mut sections = [&mut answers, &mut authority, &mut additionals];
            match request.protocol() {
                Protocol::Udp => {
                    let limit = usize::from(edns.max_payload());
                    metadata.truncation = fit_with_opt(limit, request, &mut sections);
                }
                Protocol::Tcp => {
                    metadata.truncation = fit_tcp_with_opt(request, edns, metadata, &mut sections);
                }
                _ => {}
            }
        }
        let message = builder.build(
            metadata,
            answers.iter(),
            authority.iter(),
            std::iter::empty(),
            additionals.iter(),
        );
        self.metrics.count(code);
        match response.send_response(message).await {
            Ok(info) => info,
            Err(e) => {
                tracing::debug!(error = %e, "cannot send DNS response");
                let mut metadata = Metadata::response_from_request(&request.metadata);
                metadata.response_code = ResponseCode::ServFail;
                hickory_server::proto::op::Header {
                    metadata,
                    counts: Default::default(),
                }
                .into()
            }
        }
    }
}

impl Handler {
    /// FORMERR for a message whose header parsed and whose body did not, with no question
    /// (none could be read), as hickory-server answers it.
    pub(super) async fn send_format_error<R: ResponseHandler>(
        &self,
        request: &Metadata,
        mut response: R,
    ) {
        self.metrics.count(ResponseCode::FormErr);
        let Ok(queries) = Queries::read(&mut BinDecoder::new(&[]), 0) else {
            return; // reading no question from nothing cannot fail
        };
        let message =
            MessageResponseBuilder::new(&queries, None).error_msg(request, ResponseCode::FormErr);
        if let Err(e) = response.send_response(message).await {
            tracing::debug!(error = %e, "cannot send FORMERR");
        }
    }

    async fn send_error<R: ResponseHandler>(
        &self,
        request: &Request,
        builder: MessageResponseBuilder<'_>,
        code: ResponseCode,
        mut response: R,
    ) -> ResponseInfo {
        self.metrics.count(code);
        let message = builder.error_msg(&request.metadata, code);
        match response.send_response(message).await {
            Ok(info) => info,
            Err(e) => {
                tracing::debug!(error = %e, "cannot send DNS error response");
                let mut metadata = Metadata::response_from_request(&request.metadata);
                metadata.response_code = code;
                hickory_server::proto::op::Header {
                    metadata,
                    counts: Default::default(),
                }
                .into()
            }
        }
    }
}

/// The bytes of an OPT record without options.
const OPT_BYTES: usize = 11;

/// Keeps an answer to an EDNS query within `limit` bytes *with* its OPT record (RFC 6891
/// section 7: a truncated answer still carries it). hickory truncates by emitting records
/// until the buffer is full, which can leave no room for the OPT record that comes last.
/// When the records, counted without name compression, could overflow, whole records are
/// dropped from the end (additionals, then authority, then answers) until they fit with
/// room for the OPT record; returns whether any was (the TC bit). Small answers, the usual
/// case, cost one size estimate per record (no encoding, no allocation).
fn fit_with_opt(limit: usize, request: &Request, sections: &mut [&mut Vec<Record>]) -> bool {
    // The question section as the request carried it (the response repeats it).
    let question = request.queries.as_bytes().len();
    let budget = limit.saturating_sub(12 + question + OPT_BYTES);
    let total: usize = sections.iter().flat_map(|r| r.iter()).map(wire_bound).sum();
    if total <= budget {
        return false;
    }
    // Keep records in section order while they fit; once one does not, none after it.
    let mut used = 0;
    let mut truncated = false;
    for records in sections.iter_mut() {
        let keep = records
            .iter()
            .take_while(|r| {
                let n = wire_bound(r);
                let fits = !truncated && used + n <= budget;
                if fits {
                    used += n;
                } else {
                    truncated = true;
                }
                fits
            })
            .count();
        records.truncate(keep);
    }
    truncated
}

/// Keeps a TCP answer to an EDNS query within a DNS message's largest size (65,535 bytes:
/// the TCP length prefix is 16 bits) *with* its OPT record, which hickory's encoder leaves
/// out when the records fill the message. Answers whose records could not come near the
/// limit even uncompressed, all but the rarest, cost the size estimate of
/// [`fit_with_opt`]; others are encoded as hickory sends them (with name compression),
/// and when that overflows, the most records that fit are found by bisection (whole
/// records kept in section order). Returns whether any record was dropped (the TC bit).
fn fit_tcp_with_opt(
    request: &Request,
    edns: &Edns,
    metadata: Metadata,
    sections: &mut [&mut Vec<Record>; 3],
) -> bool {
    let question = request.queries.as_bytes().len();
    let budget = usize::from(u16::MAX).saturating_sub(12 + question + OPT_BYTES);
    let total: usize = sections.iter().flat_map(|r| r.iter()).map(wire_bound).sum();
    if total <= budget {
        return false;
    }
    let lens = sections.each_ref().map(|r| r.len());
    // The first `k` records in section order.
    let split = |k: usize| {
        let mut left = k;
        lens.map(|n| {
            let take = n.min(left);
            left -= take;
            take
        })
    };
    let fits = |k: usize| {
        let [a, b, c] = split(k);
        let mut builder = MessageResponseBuilder::from_message_request(request);
        builder.edns(edns);
        let message = builder.build(
            metadata,
            sections[0][..a].iter(),
            sections[1][..b].iter(),
            std::iter::empty(),
            sections[2][..c].iter(),
        );
        let mut buf = Vec::with_capacity(usize::from(u16::MAX));
        // The encoder stops at 65,535 bytes and says so in the header's TC bit.
        message
            .destructive_emit(&mut BinEncoder::new(&mut buf))
            .is_ok_and(|info| !info.truncation)
    };
    let all = lens.iter().sum::<usize>();
    if fits(all) {
        return false;
    }
    // fits(lo) and !fits(hi); no records at all always fit beside a question.
    let (mut lo, mut hi) = (0, all);
    while hi - lo > 1 {
        let mid = lo + (hi - lo) / 2;
        if fits(mid) {
            lo = mid;
        } else {
            hi = mid;
        }
    }
    for (records, keep) in sections.iter_mut().zip(split(lo)) {
        records.truncate(keep);
    }
    true
}

/// At least the bytes `record` takes on the wire, without allocating: its owner name and
/// rdata uncompressed (a name's text length plus one), plus type, class, TTL and rdata
/// length (10 bytes).
fn wire_bound(record: &Record) -> usize {
    let name = |n: &Name| n.len() + 1;
    let rdata = match &record.data {
        RData::A(_) => 4,
        RData::AAAA(_) => 16,
        RData::SRV(srv) => 6 + name(&srv.target),
        RData::NS(ns) => name(&ns.0),
        RData::SOA(soa) => name(&soa.mname) + name(&soa.rname) + 20,
        RData::TXT(txt) => txt.txt_data.iter().map(|t| t.len() + 1).sum(),
        // Not among the records the handler makes (`to_records`); encoded to be sure.
        other => other.to_bytes().map_or(usize::MAX / 4, |b| b.len()),
    };
    name(&record.name) + 10 + rdata
}

fn query_type(t: RecordType) -> QueryType {
    match t {
        RecordType::A => QueryType::A,
        RecordType::AAAA => QueryType::Aaaa,
        RecordType::SRV => QueryType::Srv,
        RecordType::TXT => QueryType::Txt,
        RecordType::SOA => QueryType::Soa,
        RecordType::NS => QueryType::Ns,
        RecordType::ANY => QueryType::Any,
        RecordType::AXFR | RecordType::IXFR => QueryType::Transfer,
        other => QueryType::Other(u16::from(other)),
    }
}

thread_local! {
    /// Names this thread has parsed for answers, by their text: the zone's apex, its name
    /// server and SOA mailbox, SRV targets, owner names. Parsing a name is the largest
    /// user-space cost of an answer (about a tenth of the server's CPU under load, most of
    /// it in answers that name the same few names again); a clone is one copy. Cleared
    /// when it holds [`NAME_CACHE`] names, so it stays small whatever is asked.
    static NAMES: std::cell::RefCell<std::collections::HashMap<Box<str>, Name>> =
        std::cell::RefCell::default();
}

/// The most names [`NAMES`] holds per thread.
const NAME_CACHE: usize = 4096;

/// `s` as a DNS name (`None` if it is not one), from [`NAMES`] when parsed before.
fn name(s: &str) -> Option<Name> {
    NAMES.with(|names| {
        let mut names = names.borrow_mut();
        if let Some(n) = names.get(s) {
            return Some(n.clone());
        }
        let n = Name::from_ascii(s).ok()?;
        if names.len() >= NAME_CACHE {
            names.clear();
        }
        names.insert(s.into(), n.clone());
        Some(n)
    })
}

fn to_records(records: &[dns::Record]) -> Vec<Record> {
    records
        .iter()
        .filter_map(|r| {
            let owner = name(&r.name)?;
            let data = match &r.data {
                dns::RData::A(ip) => RData::A(A(*ip)),
                dns::RData::Aaaa(ip) => RData::AAAA(AAAA(*ip)),
                dns::RData::Srv {
                    priority,
                    weight,
                    port,
                    target,
                } => RData::SRV(SRV::new(*priority, *weight, *port, name(target)?)),
                dns::RData::Txt(text) => RData::TXT(TXT::new(vec![text.clone()])),
                dns::RData::Ns(ns) => RData::NS(NS(name(ns)?)),
                dns::RData::Soa {
                    mname,
                    rname,
                    serial,
                    refresh,
                    retry,
                    expire,
                    minimum,
                } => RData::SOA(SOA::new(
                    name(mname)?,
                    name(rname)?,
                    *serial,
                    i32::try_from(*refresh).unwrap_or(i32::MAX),
                    i32::try_from(*retry).unwrap_or(i32::MAX),
                    i32::try_from(*expire).unwrap_or(i32::MAX),
                    *minimum,
                )),
            };
            Some(Record::from_rdata(owner, r.ttl, data))
        })
        .collect()
}
