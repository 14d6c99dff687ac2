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
        ("capacity", "1000001", "above"),
        ("capacity", "254", "above 253"),
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
        #expect(try parse([("policy", "bounded"), ("capacity", "253")]).bufferingPolicy == .bounded(253))
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

/// The capacity ceiling keeps a full queue of the largest messages within the byte budget.
@Suite struct LimitTests {
    @Test func theDefaultCeilingFitsTheBudget() {
        let limits = FeedLimits()
        #expect(limits.maximumCapacity == 253)
        #expect(FeedMessage.largestFrameCapacity == 16_384)
        #expect(limits.maximumCapacity * FeedMessage.largestBytes <= limits.queueBytes)
        #expect((limits.maximumCapacity + 1) * FeedMessage.largestBytes > limits.queueBytes)
    }

    @Test func theLargestMessageIsTheLargestFrame() {
        // Every byte escaped in two, seq and sent as long as they get.
        let payload = String(repeating: "\"", count: PublishBody.maximumBytes)
        let message = FeedMessage(seq: Int.max, payload: payload, receivedAt: 0)
        #expect(message.frame.readableBytes <= FeedMessage.largestFrameBytes)
        #expect(message.bytes <= FeedMessage.largestBytes)
    }

    @Test func aCapacityAboveTheServersCeilingIsRefused() {
        #expect(throws: BadFeedQuery.self) { try FeedQuery(parameters: [("capacity", "11")], maximumCapacity: 10) }
        #expect(try! FeedQuery(parameters: [("capacity", "10")], maximumCapacity: 10).capacity == 10)
    }
}

/// POST /publish bodies: the client's errors, found before any database connection is used.
@Suite struct PublishBodyTests {
    func reason(_ bytes: [UInt8]) -> String? {
        if case .failure(let bad) = PublishBody.validate(bytes) { return bad.reason }
        return nil
    }

    @Test func textIsAccepted() {
        #expect(reason(Array("héllo\tworld\r\n✓".utf8)) == nil)
        #expect(reason([]) == nil)
        #expect(reason(Array(repeating: UInt8(ascii: "a"), count: 7_999)) == nil)
    }

    @Test func sizeIsCountedInBytesReceived() {
        #expect(reason(Array(repeating: UInt8(ascii: "a"), count: 8_000))?.contains("8000 bytes") == true)
        // 2,700 three-byte characters: 8,100 bytes, 2,700 characters.
        #expect(reason(Array(String(repeating: "€", count: 2_700).utf8))?.contains("8100 bytes") == true)
    }

    @Test func nulAndControlCharactersAreRefused() {
        #expect(reason(Array("a\u{0}b".utf8)) == "NUL (U+0000) at byte 1: a message is text without control characters but tab, LF and CR")
        #expect(reason(Array("ab\u{1}".utf8))?.hasPrefix("control character (U+0001) at byte 2") == true)
    }

    @Test func invalidUTF8IsRefusedNotReplaced() {
        #expect(reason([0x61, 0xFF, 0x62]) == "the body is not valid UTF-8 (at byte 1)")
        #expect(reason([0x61, 0x62, 0xE2, 0x82]) == "the body is not valid UTF-8 (at byte 2)")
        #expect(reason([0xED, 0xA0, 0x80]) != nil)  // a surrogate
    }
}

/// Topic names are PostgreSQL channels: anything but `[a-z0-9_-]{1,48}` is
/// refused before the upgrade, with the reason.
@Suite struct FeedTopicTests {
    @Test func theDefaultTopicIsFeed() throws {
        #expect(try FeedQuery(parameters: []).topic == "feed")
        #expect(try FeedTopic.from(parameters: []) == "feed")
    }

    @Test(arguments: ["a", "room-1", "user_42", "0", String(repeating: "z", count: 48)])
    func validNamesPass(name: String) throws {
        #expect(try FeedQuery(parameters: [(name: "topic", value: name)]).topic == name)
        #expect(try FeedTopic.from(parameters: [(name: "topic", value: name)]) == name)
    }

    @Test(arguments: [
        ("", "empty"),
        (String(repeating: "z", count: 49), "at most 48"),
        ("Room", "a character other than"),
        ("a b", "a character other than"),
        ("a\"b", "a character other than"),
        ("a;b", "a character other than"),
        ("é", "a character other than"),
        ("a\u{0}", "a character other than"),
    ])
    func badNamesAreRefusedWithAReason(name: String, reason: String) {
        #expect {
            try FeedTopic.validated(name)
        } throws: { error in
            (error as? BadFeedQuery)?.reason.contains(reason) == true
        }
    }
}
