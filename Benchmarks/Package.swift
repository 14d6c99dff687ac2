// swift-tools-version:6.1
// Benchmarks for AsyncBroadcast. A separate package so that the library itself
// keeps zero dependencies. Run from the repository root:
//
//   swift run -c release --package-path Benchmarks fanout-compare [--smoke]
//   swift package --package-path Benchmarks benchmark
import PackageDescription

// The library is the package one directory up; SwiftPM names a path
// dependency after its directory, so look the name up rather than assume it.
let library = String(Context.packageDirectory.split(separator: "/").dropLast().last ?? "AsyncBroadcast")

let package = Package(
    name: "AsyncBroadcastBenchmarks",
    platforms: [.macOS(.v15)],
    dependencies: [
        .package(path: ".."),
        // The "MallocInterposer" trait alone: it gives mallocCountTotal, and it
        // leaves out the default "RuntimeInterposer" trait (and its extra package).
        .package(url: "https://github.com/ordo-one/benchmark", from: "1.38.1", traits: ["MallocInterposer"]),
        .package(url: "https://github.com/ordo-one/malloc-interposer.git", from: "1.5.0"),
        .package(url: "https://github.com/apple/swift-async-algorithms", from: "1.1.4"),
        .package(url: "https://github.com/OpenCombine/OpenCombine", from: "0.14.0"),
    ],
    targets: [
        // The peers and the workloads, shared by both front ends.
        .target(
            name: "FanoutKit",
            dependencies: [
                .product(name: "AsyncBroadcast", package: library),
                .product(name: "AsyncAlgorithms", package: "swift-async-algorithms"),
                .product(name: "OpenCombine", package: "OpenCombine"),
            ],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        // All peers interleaved in one process; prints a markdown table.
        .executableTarget(
            name: "fanout-compare",
            dependencies: [
                "FanoutKit",
                .product(name: "MallocInterposerSwift", package: "malloc-interposer"),
            ],
            swiftSettings: [.swiftLanguageMode(.v6)]
        ),
        // ordo-one/benchmark suite: `swift package --package-path Benchmarks benchmark`.
        .executableTarget(
            name: "FanoutBenchmarks",
            dependencies: [
                "FanoutKit",
                .product(name: "Benchmark", package: "benchmark"),
            ],
            path: "Benchmarks/FanoutBenchmarks",
            swiftSettings: [.swiftLanguageMode(.v6)],
            plugins: [.plugin(name: "BenchmarkPlugin", package: "benchmark")]
        ),
    ]
)
