import AsyncBroadcast

/// What a value round's `BroadcastValue` holds (`EqValue` or `PlainValue`).
///
/// Every fresh change carries a new sequence number (`seq`), taken where its
/// order is known (inside `update`'s body, or under the harness lock that
/// serializes writers); the initial value has seq 0. The payload (a counted
/// class instance and a heap array) is derived from the seq, so a reader can
/// verify it, and the live counter proves that replaced, conflated and
/// discarded values are released.
protocol StressValue: Sendable {
    /// `EqValue` is `Equatable` (equal writes are not changes); `PlainValue`
    /// is not (every write is a change).
    static var isEquatableKind: Bool { get }
    static var typeName: String { get }
    init(core: ValueCore)
    var core: ValueCore { get set }
}

extension StressValue {
    init(seq: Int, producer: Int, payload: ValuePayloadKind) {
        self.init(core: ValueCore(seq: seq, producer: producer, payload: payload))
    }

    var seq: Int { core.seq }
    var producer: Int { core.producer }

    /// Rewrites the value in place: the array is mutated, not replaced (a
    /// copy-on-write copy while the library still holds the previous value).
    mutating func overwrite(seq: Int, producer: Int) { core.overwrite(seq: seq, producer: producer) }

    /// A new value equal to this one (`==` for `EqValue`), with its own payload object.
    func copy() -> Self { Self(core: core.copy()) }

    func integrityProblem() -> String? { core.integrityProblem() }
}

enum ValuePayloadKind: Sendable, CaseIterable {
    case none, object, numbers, objectAndNumbers

    var hasObject: Bool { self == .object || self == .objectAndNumbers }
    var hasNumbers: Bool { self == .numbers || self == .objectAndNumbers }
}

/// The fields (deliberately not `Equatable`: `PlainValue` must not be).
struct ValueCore: Sendable {
    private(set) var seq: Int
    private(set) var producer: Int
    let payload: ValuePayloadKind
    private(set) var object: Payload?
    private(set) var numbers: [Int]

    init(seq: Int, producer: Int, payload: ValuePayloadKind) {
        self.seq = seq
        self.producer = producer
        self.payload = payload
        object = payload.hasObject ? Payload(key: seq) : nil
        numbers = []
        if payload.hasNumbers { Self.fill(&numbers, seq) }
    }

    mutating func overwrite(seq: Int, producer: Int) {
        self.seq = seq
        self.producer = producer
        if payload.hasObject { object = Payload(key: seq) }
        if payload.hasNumbers { Self.fill(&numbers, seq) }
    }

    func copy() -> ValueCore { ValueCore(seq: seq, producer: producer, payload: payload) }

    private static func fill(_ numbers: inout [Int], _ seq: Int) {
        numbers.removeAll(keepingCapacity: true)
        for index in 0..<(1 + (seq % 7 + 7) % 7) { numbers.append(seq &+ index &* 7919) }
    }

    func integrityProblem() -> String? {
        if let object, object.key != seq { return "value v\(seq) carries the payload object of v\(object.key)" }
        if payload.hasObject && object == nil { return "value v\(seq) lost its payload object" }
        if payload.hasNumbers {
            var expected: [Int] = []
            Self.fill(&expected, seq)
            if numbers != expected { return "value v\(seq) has a corrupted array payload \(numbers.prefix(8))" }
        } else if !numbers.isEmpty {
            return "value v\(seq) has an array payload it never had"
        }
        return nil
    }

    func sameContent(_ other: ValueCore) -> Bool {
        seq == other.seq && producer == other.producer && numbers == other.numbers && object?.key == other.object?.key
    }
}

/// `Equatable`: a write that leaves the value `==` the current one is not a change.
struct EqValue: StressValue, Equatable {
    static let isEquatableKind = true
    static let typeName = "Equatable"
    var core: ValueCore
    init(core: ValueCore) { self.core = core }
    static func == (lhs: EqValue, rhs: EqValue) -> Bool { lhs.core.sameContent(rhs.core) }
}

/// Not `Equatable`: every `send`/`update` is a change, even one that writes
/// the same content.
struct PlainValue: StressValue {
    static let isEquatableKind = false
    static let typeName = "non-Equatable"
    var core: ValueCore
    init(core: ValueCore) { self.core = core }
}
