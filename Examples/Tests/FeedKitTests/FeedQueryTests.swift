import FeedKit
import Testing

/// The server refuses every query the library would trap on, before any
/// subscription exists; these pin the rules and their one-line reasons.
@Suite struct FeedQueryTests {
    func parse(_ pairs: [(String, String)]) throws(BadFeedQuery) -> FeedQuery {
        try FeedQuery(parameters: pairs.map { (name: $0.0, value: $0.1) })
    }

    @Test func defaultsAreNewest64() throws {
        #expect(try parse([]) == FeedQuery(policy: .newest, capacity: 64))
    }

    @Test func everyPolicyParses() throws {
        for policy in FeedQuery.Policy.allCases {
            #expect(try parse([("policy", policy.rawValue), ("capacity", "3")]).policy == policy)
        }
    }

    @Test(arguments: [
        ("policy", "Newest", "unknown policy"),
        ("policy", "", "unknown policy"),
        ("capacity", "abc", "not an integer"),
        ("capacity", "1.5", "not an integer"),
        ("capacity", "-1", "negative"),
        ("capacity", "1000001", "above 1000000"),
    ])
    func badValuesAreRefusedWithAReason(name: String, value: String, reason: String) {
        #expect {
            _ = try parse([(name, value)])
        } throws: { error in
            guard let error = error as? BadFeedQuery else { return false }
            return error.reason.contains(reason) && !error.reason.contains("\n")
        }
    }

    @Test func boundedZeroIsRefusedButOtherZerosAreNot() throws {
        #expect(throws: BadFeedQuery.self) { try parse([("policy", "bounded"), ("capacity", "0")]) }
        #expect(throws: BadFeedQuery.self) { try parse([("capacity", "0"), ("policy", "bounded")]) }
        #expect(try parse([("policy", "newest"), ("capacity", "0")]).capacity == 0)
        #expect(try parse([("policy", "bounded"), ("capacity", "1000000")]).bufferingPolicy == .bounded(1_000_000))
    }
}

@Suite struct FrameTests {
    @Test func bodyIsAJSONStringAndSentComesFromThePayload() {
        let message = FeedMessage(seq: 7, payload: #"{"sent":1700000000123,"x":"a\"b"}"#, receivedAt: 5)
        #expect(message.sent == 1_700_000_000_123)
        #expect(String(buffer: message.frame) == #"{"type":"message","seq":7,"sent":1700000000123,"body":"{\"sent\":1700000000123,\"x\":\"a\\\"b\"}"}"#)
    }

    @Test func aPayloadWithoutANumericSentGetsTheReceiveTime() {
        #expect(FeedMessage(seq: 1, payload: "hello", receivedAt: 42).sent == 42)
        #expect(FeedMessage(seq: 1, payload: #"{"sent":"soon"}"#, receivedAt: 42).sent == 42)
        #expect(FeedMessage(seq: 1, payload: #"{"sent":true}"#, receivedAt: 42).sent == 42)
    }

    @Test func controlCharactersAreEscaped() {
        #expect(jsonString("a\nb\u{1}\t\\") == #""a\nb\u0001\t\\""#)
    }
}
