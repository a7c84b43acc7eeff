//! Frames over a real mutual-TLS QUIC connection on 127.0.0.1: caps, malformed and truncated input, clean ends.

mod common;

use common::{Echo, Pair, bounded};
use granary_net::frame::{self, MAX_FRAME_BYTES, StreamError};
use granary_proto::frame::{FrameError, FramePart};

/// Opens a stream from the client, writes `bytes`, optionally finishes it, and returns the server's receiving side
/// (and the client's send side, which must stay alive while the server reads an unfinished stream).
async fn send_raw(pair: &Pair, bytes: &[u8], finish: bool) -> (quinn::SendStream, quinn::RecvStream) {
    let (mut send, _client_recv) = pair.client.open_bi().await.expect("open_bi");
    send.write_all(bytes).await.expect("write");
    if finish {
        send.finish().expect("finish");
    }
    let (_server_send, recv) = bounded("accept_bi", pair.server.accept_bi()).await.expect("accept_bi");
    (send, recv)
}

fn prefix(len: u32) -> Vec<u8> {
    len.to_le_bytes().to_vec()
}

#[tokio::test]
async fn a_declared_length_above_the_cap_is_refused_before_the_body_arrives() {
    let pair = Pair::new().await;
    // Only the prefix is sent and the stream stays open: a reader that waited for the body would time out.
    let (_send, mut recv) = send_raw(&pair, &prefix(u32::MAX), false).await;
    let result = bounded("read_frame", frame::read_frame::<Echo>(&mut recv, MAX_FRAME_BYTES)).await;
    assert!(
        matches!(result, Err(StreamError::Frame(FrameError::TooLarge { len, cap: MAX_FRAME_BYTES })) if len == u32::MAX as usize),
        "{result:?}"
    );

    let (_send, mut recv) = send_raw(&pair, &prefix(1001), false).await;
    let result = bounded("read_frame", frame::read_frame::<Echo>(&mut recv, 1000)).await;
    assert!(matches!(result, Err(StreamError::Frame(FrameError::TooLarge { len: 1001, cap: 1000 }))), "{result:?}");
}

#[tokio::test]
async fn malformed_json_is_an_error() {
    let pair = Pair::new().await;
    let mut bytes = prefix(5);
    bytes.extend_from_slice(b"{nope");
    let (_send, mut recv) = send_raw(&pair, &bytes, true).await;
    let result = bounded("read_frame", frame::read_frame::<Echo>(&mut recv, MAX_FRAME_BYTES)).await;
    assert!(matches!(result, Err(StreamError::Frame(FrameError::Malformed { .. }))), "{result:?}");

    // Valid JSON of the wrong shape is malformed too.
    let mut bytes = prefix(2);
    bytes.extend_from_slice(b"[]");
    let (_send, mut recv) = send_raw(&pair, &bytes, true).await;
    let result = bounded("read_frame", frame::read_frame::<Echo>(&mut recv, MAX_FRAME_BYTES)).await;
    assert!(matches!(result, Err(StreamError::Frame(FrameError::Malformed { .. }))), "{result:?}");
}

#[tokio::test]
async fn a_stream_that_ends_inside_a_frame_is_truncated() {
    let pair = Pair::new().await;
    let mut bytes = prefix(100);
    bytes.extend_from_slice(&[b' '; 10]);
    let (_send, mut recv) = send_raw(&pair, &bytes, true).await;
    let result = bounded("read_frame", frame::read_frame::<Echo>(&mut recv, MAX_FRAME_BYTES)).await;
    assert!(
        matches!(result, Err(StreamError::Frame(FrameError::Truncated { part: FramePart::Body, read: 10, len: 100 }))),
        "{result:?}"
    );

    let (_send, mut recv) = send_raw(&pair, &[7, 0], true).await;
    let result = bounded("read_frame", frame::read_frame::<Echo>(&mut recv, MAX_FRAME_BYTES)).await;
    assert!(
        matches!(result, Err(StreamError::Frame(FrameError::Truncated { part: FramePart::Header, read: 2, len: 4 }))),
        "{result:?}"
    );
}

#[tokio::test]
async fn a_clean_end_between_frames_is_none() {
    let pair = Pair::new().await;
    let first = Echo { seq: 1, text: "one".into() };
    let second = Echo { seq: 2, text: "two".into() };
    let mut bytes = frame::encode_frame(&first).unwrap();
    bytes.extend(frame::encode_frame(&second).unwrap());
    let (_send, mut recv) = send_raw(&pair, &bytes, true).await;
    for expected in [Some(first), Some(second), None] {
        let got = bounded("read_frame", frame::read_frame::<Echo>(&mut recv, MAX_FRAME_BYTES)).await.unwrap();
        assert_eq!(got, expected);
    }

    // A stream finished before any byte is a clean end too.
    let (_send, mut recv) = send_raw(&pair, &[], true).await;
    let got = bounded("read_frame", frame::read_frame::<Echo>(&mut recv, MAX_FRAME_BYTES)).await.unwrap();
    assert_eq!(got, None);
}

#[tokio::test]
async fn write_frame_output_is_read_back_by_read_frame() {
    let pair = Pair::new().await;
    let (mut send, _recv) = pair.client.open_bi().await.unwrap();
    let msg = Echo { seq: u64::MAX, text: "ünïcode \"quoted\"\n".into() };
    bounded("write_frame", frame::write_frame(&mut send, &msg)).await.unwrap();
    send.finish().unwrap();
    let (_send, mut recv) = bounded("accept_bi", pair.server.accept_bi()).await.unwrap();
    assert_eq!(bounded("read", frame::read_frame::<Echo>(&mut recv, MAX_FRAME_BYTES)).await.unwrap(), Some(msg));
}

#[tokio::test]
async fn call_reports_a_missing_response_and_a_lost_connection() {
    let pair = Pair::new().await;
    let server = pair.server.clone();
    let responder = tokio::spawn(async move {
        // Reads the request, then finishes the response stream without writing a frame.
        let (mut send, mut recv) = server.accept_bi().await.expect("accept_bi");
        let req: Option<Echo> = frame::read_frame(&mut recv, MAX_FRAME_BYTES).await.expect("request");
        send.finish().expect("finish");
        req
    });
    let req = Echo { seq: 9, text: "anyone?".into() };
    let result = bounded("call", frame::call::<_, Echo>(&pair.client, &req, MAX_FRAME_BYTES)).await;
    assert!(
        matches!(result, Err(StreamError::NoResponse { peer }) if peer == pair.client.remote_address()),
        "{result:?}"
    );
    assert_eq!(bounded("responder", responder).await.unwrap(), Some(req.clone()));

    pair.server.close(0u32.into(), b"bye");
    bounded("client sees the close", pair.client.closed()).await;
    let result = bounded("call after close", frame::call::<_, Echo>(&pair.client, &req, MAX_FRAME_BYTES)).await;
    let err = result.unwrap_err();
    assert!(matches!(err, StreamError::ConnectionLost { peer, .. } if peer == pair.client.remote_address()), "{err:?}");
    assert!(err.is_connection_lost());
}
