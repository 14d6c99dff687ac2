import AsyncBroadcast
import AsyncBroadcastTestSupport

/// Live `Payload` instances: must be back to 0 after every round.
enum LiveObjects {
    static let count = Locked<Int>(0)
}

/// A class payload that counts its live instances, to prove that buffers,
/// evictions, cancellations and finished sequences release their elements.
final class Payload: Sendable {
    let key: Int
    init(key: Int) {
        self.key = key
        LiveObjects.count.withLock { $0 += 1 }
    }
    deinit { LiveObjects.count.withLock { $0 -= 1 } }
}

/// What a producer attaches to its elements.
enum PayloadKind: Sendable, CaseIterable {
    case none, object, numbers, text, objectAndNumbers
}

/// A value payload with a heap buffer, derived from the element's key so a
/// consumer can verify it.
enum ValuePayload: Sendable {
    case none
    case numbers([Int])
    case text(String)
}

/// The element: who sent it, its position in that producer's sequence, and
/// a payload whose content is checked on receipt.
struct Item: Sendable {
    let producer: Int
    let index: Int
    let object: Payload?
    let value: ValuePayload

    /// Identifies the element across the whole round.
    var key: Int { Item.key(producer: producer, index: index) }

    static func key(producer: Int, index: Int) -> Int { producer << 32 | index }
    static func producer(of key: Int) -> Int { key >> 32 }
    static func index(of key: Int) -> Int { key & 0xFFFF_FFFF }
    static func describe(_ key: Int) -> String { "p\(producer(of: key))#\(index(of: key))" }

    init(producer: Int, index: Int, payload: PayloadKind) {
        self.producer = producer
        self.index = index
        let key = Item.key(producer: producer, index: index)
        switch payload {
        case .none:
            object = nil; value = .none
        case .object:
            object = Payload(key: key); value = .none
        case .numbers:
            object = nil; value = .numbers(Item.numbers(for: key))
        case .text:
            object = nil; value = .text(Item.text(for: key))
        case .objectAndNumbers:
            object = Payload(key: key); value = .numbers(Item.numbers(for: key))
        }
    }

    private static func numbers(for key: Int) -> [Int] {
        (0..<(1 + key % 5)).map { key &+ $0 &* 7919 }
    }

    private static func text(for key: Int) -> String {
        "element \(describe(key)) with a heap-allocated text payload"
    }

    /// A description of the damage if the payload does not match the key.
    func integrityProblem() -> String? {
        if let object, object.key != key { return "class payload of \(Item.describe(key)) carries key \(Item.describe(object.key))" }
        switch value {
        case .none: return nil
        case .numbers(let numbers):
            return numbers == Item.numbers(for: key) ? nil : "value payload of \(Item.describe(key)) is corrupted: \(numbers)"
        case .text(let text):
            return text == Item.text(for: key) ? nil : "text payload of \(Item.describe(key)) is corrupted: \(text)"
        }
    }
}

/// The failure that `finish(throwing:)` ends a round with.
struct StressError: Error, Equatable, Sendable {
    let code: Int
}

typealias Stream = BroadcastSequence<Item, StressError>
