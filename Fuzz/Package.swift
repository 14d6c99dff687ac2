// swift-tools-version:6.0
// libFuzzer targets for AsyncBroadcast. Build and run through `./run.sh`
// (it passes the sanitizer flags and turns on the library's internal
// invariant checks); see README.md.
import Foundation
import PackageDescription

// The library is the package one directory up. SwiftPM names a path
// dependency after its directory, so read that name instead of assuming it.
let libraryPackage = URL(fileURLWithPath: Context.packageDirectory)
    .deletingLastPathComponent().lastPathComponent

let fuzzerSettings: [SwiftSetting] = [
    .swiftLanguageMode(.v5),
    // libFuzzer provides `main`.
    .unsafeFlags(["-parse-as-library"]),
]

let package = Package(
    name: "AsyncBroadcastFuzz",
    dependencies: [.package(path: "..")],
    targets: [
        .target(
            name: "FuzzKit",
            dependencies: [.product(name: "AsyncBroadcast", package: libraryPackage)],
            swiftSettings: [.swiftLanguageMode(.v5)]
        ),
        .executableTarget(
            name: "fuzz-seq",
            dependencies: [
                "FuzzKit",
                .product(name: "AsyncBroadcast", package: libraryPackage),
                // `ManualClock` (soft eviction limits) and `ManualExecutor`
                // (events reads: `next()` of `events` is async).
                .product(name: "AsyncBroadcastTestSupport", package: libraryPackage),
            ],
            swiftSettings: fuzzerSettings
        ),
        .executableTarget(
            name: "fuzz-sched",
            dependencies: [
                "FuzzKit",
                .product(name: "AsyncBroadcast", package: libraryPackage),
                // The shared deterministic executor (`ManualExecutor`).
                .product(name: "AsyncBroadcastTestSupport", package: libraryPackage),
            ],
            swiftSettings: fuzzerSettings
        ),
        .executableTarget(
            name: "fuzz-value",
            dependencies: [
                "FuzzKit",
                .product(name: "AsyncBroadcast", package: libraryPackage),
                .product(name: "AsyncBroadcastTestSupport", package: libraryPackage),
            ],
            swiftSettings: fuzzerSettings
        ),
        .executableTarget(
            name: "fuzz-share",
            dependencies: [
                "FuzzKit",
                .product(name: "AsyncBroadcast", package: libraryPackage),
                // `ManualClock` (stop timers) and `ManualExecutor`.
                .product(name: "AsyncBroadcastTestSupport", package: libraryPackage),
            ],
            swiftSettings: fuzzerSettings
        ),
        .executableTarget(
            name: "fuzz-topics",
            dependencies: [
                "FuzzKit",
                .product(name: "AsyncBroadcast", package: libraryPackage),
                // `ManualClock` (stop timers) and `ManualExecutor` (emit).
                .product(name: "AsyncBroadcastTestSupport", package: libraryPackage),
            ],
            swiftSettings: fuzzerSettings
        ),
    ]
)
