// swift-tools-version:6.1
// LiveFeed: the server users build with AsyncBroadcast. A WebSocket fan-out
// (Hummingbird 2) fed by PostgreSQL LISTEN/NOTIFY, with two hand-written hubs
// to compare against, and a load tool. A separate package, like Benchmarks/,
// so that the library itself keeps zero dependencies.
//
//   bash Examples/scripts/smoke.sh            # the whole check, as CI runs it
//   swift build --package-path Examples       # just build
import PackageDescription

// The library is the package one directory up; SwiftPM names a path
// dependency after its directory, so look the name up rather than assume it.
let library = String(Context.packageDirectory.split(separator: "/").dropLast().last ?? "AsyncBroadcast")

let package = Package(
    name: "LiveFeed",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(path: ".."),
        .package(url: "https://github.com/hummingbird-project/hummingbird", from: "2.28.1"),
        .package(url: "https://github.com/hummingbird-project/hummingbird-websocket", from: "2.8.1"),
        .package(url: "https://github.com/vapor/postgres-nio", from: "1.33.2"),
        .package(url: "https://github.com/apple/swift-argument-parser", from: "1.8.2"),
        .package(url: "https://github.com/apple/swift-async-algorithms", from: "1.1.4"),
        // Already in the graph through Hummingbird; named because feed-server uses them directly.
        .package(url: "https://github.com/apple/swift-nio", from: "2.101.0"),
        .package(url: "https://github.com/swift-server/swift-service-lifecycle", from: "2.13.0"),
        .package(url: "https://github.com/apple/swift-metrics", from: "2.13.0"),
        // The Prometheus registry behind `GET /metrics` (feed-server only: FeedKit speaks swift-metrics).
        .package(url: "https://github.com/swift-server/swift-prometheus", from: "2.4.1"),
    ],
    targets: [
        // The hubs, the feed from PostgreSQL, the wire format: everything the
        // server does that is not routing.
        .target(
            name: "FeedKit",
            dependencies: [
                .product(name: "AsyncBroadcast", package: library),
                .product(name: "AsyncAlgorithms", package: "swift-async-algorithms"),
                .product(name: "PostgresNIO", package: "postgres-nio"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdWebSocket", package: "hummingbird-websocket"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "Metrics", package: "swift-metrics"),
            ],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        .executableTarget(
            name: "feed-server",
            dependencies: [
                "FeedKit",
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
                .product(name: "Hummingbird", package: "hummingbird"),
                .product(name: "HummingbirdCore", package: "hummingbird"),
                .product(name: "HummingbirdWebSocket", package: "hummingbird-websocket"),
                .product(name: "NIOConcurrencyHelpers", package: "swift-nio"),
                .product(name: "NIOCore", package: "swift-nio"),
                .product(name: "NIOHTTP1", package: "swift-nio"),
                .product(name: "ServiceLifecycle", package: "swift-service-lifecycle"),
                .product(name: "Metrics", package: "swift-metrics"),
                .product(name: "Prometheus", package: "swift-prometheus"),
            ],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        .executableTarget(
            name: "feed-load",
            dependencies: [
                "FeedKit",
                .product(name: "HummingbirdWSClient", package: "hummingbird-websocket"),
                .product(name: "ArgumentParser", package: "swift-argument-parser"),
            ],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        .testTarget(
            name: "FeedKitTests",
            dependencies: ["FeedKit"],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
    ]
)
