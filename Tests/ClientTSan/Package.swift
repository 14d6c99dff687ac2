// swift-tools-version:6.0
// A client of AsyncBroadcast, built the way a user builds it: its own
// package, the library as a dependency, and ThreadSanitizer over both, with
// no suppression file. Run it through `scripts/client-tsan.sh` from the
// repository root (see the header there).
import Foundation
import PackageDescription

// The library is the package two directories up. SwiftPM names a path
// dependency after its directory, so read that name instead of assuming it.
let libraryPackage = URL(fileURLWithPath: Context.packageDirectory)
    .deletingLastPathComponent().deletingLastPathComponent().lastPathComponent

let package = Package(
    name: "ClientTSan",
    platforms: [.macOS(.v15)],  // Synchronization's Atomic and Mutex
    dependencies: [.package(path: "../..")],
    targets: [
        .executableTarget(
            name: "client-tsan",
            dependencies: [.product(name: "AsyncBroadcast", package: libraryPackage)]
        ),
    ]
)
