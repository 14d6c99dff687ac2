// swift-tools-version:6.0
// A client of AsyncBroadcast that misuses it on purpose, one case per run:
// `misuse-probe CASE`. Built in release by `scripts/release-traps.sh` from
// the repository root, which checks that every misuse traps AND prints its
// `AsyncBroadcast misuse: ...` message, as a user's release build would.
import Foundation
import PackageDescription

// The library is the package two directories up. SwiftPM names a path
// dependency after its directory, so read that name instead of assuming it.
let libraryPackage = URL(fileURLWithPath: Context.packageDirectory)
    .deletingLastPathComponent().deletingLastPathComponent().lastPathComponent

let package = Package(
    name: "ReleaseTraps",
    platforms: [.macOS(.v15)],  // the typed init(upstream:) (AsyncSequence.Failure)
    dependencies: [.package(path: "../..")],
    targets: [
        .executableTarget(
            name: "misuse-probe",
            dependencies: [.product(name: "AsyncBroadcast", package: libraryPackage)]
        ),
    ]
)
