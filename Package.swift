// swift-tools-version:6.0
import PackageDescription

// `ASYNCBROADCAST_INTERNAL_CHECKS=1 swift test` compiles the storage
// invariant checks (`_checkInvariants()`) into the library; CI turns them on
// for the debug tests, the ThreadSanitizer tests and the fuzz builds. Users'
// builds never see them.
let internalChecks: [SwiftSetting] = Context.environment["ASYNCBROADCAST_INTERNAL_CHECKS"] == "1"
    ? [.define("ASYNCBROADCAST_INTERNAL_CHECKS")]
    : []
// The same builds let the C shim park the sequence lock's waiters on the
// mutex/condition table that Apple platforms use, instead of the futex, when
// run with ASYNCBROADCAST_PARK_TABLE=1: the table is tested on Linux.
let internalChecksC: [CSetting] = Context.environment["ASYNCBROADCAST_INTERNAL_CHECKS"] == "1"
    ? [.define("CAB_INTERNAL_CHECKS")]
    : []

// `ASYNCBROADCAST_WEAK_MEMORY=1` routes every atomic and lock operation
// through the weak-memory model in `_CAtomics/WeakMemory.c`, so that the
// deterministic checkers (the fuzz targets, the litmus runner) decide when
// each store becomes visible to other threads. Slow; never for users.
let weakMemory: [SwiftSetting] = Context.environment["ASYNCBROADCAST_WEAK_MEMORY"] == "1"
    ? [.define("ASYNCBROADCAST_WEAK_MEMORY")]
    : []

// `ASYNCBROADCAST_RUNTIME_FAULTS=1` compiles every deliberate fault of
// `Support/FaultInjection.swift` in, switched at run time by the environment
// variable `ASYNCBROADCAST_FAULT=<NAME>`: the fault scripts
// (scripts/stress-faults.sh, scripts/test-faults.sh, Fuzz/fault-check.sh)
// build once and run each fault, instead of building once per fault.
let runtimeFaults: [SwiftSetting] = Context.environment["ASYNCBROADCAST_RUNTIME_FAULTS"] == "1"
    ? [.define("ASYNCBROADCAST_RUNTIME_FAULTS")]
    : []

let package = Package(
    name: "AsyncBroadcast",
    platforms: [.macOS(.v10_15), .iOS(.v13), .tvOS(.v13), .watchOS(.v6)],
    products: [
        .library(name: "AsyncBroadcast", targets: ["AsyncBroadcast"]),
        // Shared by the tests and the fuzz package (one locked box, one
        // manual executor); not for users.
        .library(name: "AsyncBroadcastTestSupport", targets: ["AsyncBroadcastTestSupport"]),
    ],
    targets: [
        // C11 atomics and an OS mutex behind static inline functions, so the
        // library does not need the `Synchronization` module (macOS 15+).
        // Underscored because it is not API: the library imports it publicly
        // only so that clients' specializations of its inlinable hot paths
        // can inline the atomics (as swift-atomics does with `_AtomicsShims`).
        .target(name: "_CAtomics", cSettings: internalChecksC),
        .target(
            name: "AsyncBroadcast",
            dependencies: ["_CAtomics"],
            // The handshake table, beside the park/wake protocol it proves.
            exclude: ["Subscriber/Handshakes.md"],
            swiftSettings: [.swiftLanguageMode(.v6)] + internalChecks + weakMemory + runtimeFaults
        ),
        .target(
            name: "AsyncBroadcastTestSupport",
            dependencies: ["_CAtomics"],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        .executableTarget(
            name: "broadcast-demo",
            dependencies: ["AsyncBroadcast"],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        .executableTarget(
            name: "broadcast-stress",
            dependencies: ["AsyncBroadcast", "AsyncBroadcastTestSupport"],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        // The handshake table's litmus checks (Sources/AsyncBroadcast/
        // Subscriber/Handshakes.md), meaningful only in a weak-memory build
        // (`bash scripts/litmus.sh`): the rows, a runner that prints them,
        // and the same rows as tests (skipped in a normal build).
        .target(
            name: "LitmusRows",
            dependencies: ["AsyncBroadcast", "AsyncBroadcastTestSupport"],
            swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        .executableTarget(
            name: "broadcast-litmus",
            dependencies: ["LitmusRows", "AsyncBroadcast"],
            swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        .testTarget(
            name: "LitmusTests",
            dependencies: ["LitmusRows", "AsyncBroadcast"],
            swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        .testTarget(
            name: "AsyncBroadcastTests",
            dependencies: ["AsyncBroadcast", "AsyncBroadcastTestSupport"],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
    ]
)
