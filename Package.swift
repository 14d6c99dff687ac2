// swift-tools-version:6.0
import PackageDescription

let package = Package(
    name: "AsyncBroadcast",
    platforms: [.macOS(.v10_15), .iOS(.v13), .tvOS(.v13), .watchOS(.v6)],
    products: [
        .library(name: "AsyncBroadcast", targets: ["AsyncBroadcast"]),
    ],
    targets: [
        // C11 atomics and an OS mutex behind static inline functions, so the
        // library does not need the `Synchronization` module (macOS 15+).
        .target(name: "CAtomics"),
        .target(
            name: "AsyncBroadcast",
            dependencies: ["CAtomics"],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        .executableTarget(
            name: "broadcast-demo",
            dependencies: ["AsyncBroadcast"],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        .executableTarget(
            name: "broadcast-stress",
            dependencies: ["AsyncBroadcast"],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        .testTarget(
            name: "AsyncBroadcastTests",
            dependencies: ["AsyncBroadcast"],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
    ]
)
