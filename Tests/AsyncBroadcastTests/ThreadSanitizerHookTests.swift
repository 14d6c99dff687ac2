import Testing
@testable import AsyncBroadcast

#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The ThreadSanitizer hooks around every continuation resume
/// (`Parking.resume`) act exactly when the TSan runtime is in the process,
/// whichever way TSan was turned on: `swift test --sanitize=thread` (the C
/// shim compiled with TSan too) or `-Xswiftc -sanitize=thread` (the shim
/// compiled without it). In a plain build they are inactive.
struct ThreadSanitizerHookTests {
    /// Whether the TSan runtime is linked into this process, asked the
    /// dynamic linker's way (a lookup by name), independently of the weak
    /// references the hooks use.
    static var runtimeInProcess: Bool {
        guard let program = dlopen(nil, RTLD_NOW) else { return false }
        defer { dlclose(program) }
        return dlsym(program, "__tsan_init") != nil
    }

    @Test func theHooksAreActiveExactlyWhenTheRuntimeIsInTheProcess() {
        let runtime = Self.runtimeInProcess
        #expect(
            ThreadSanitizer.isActive == runtime,
            "TSan runtime \(runtime ? "in" : "not in") the process, but the hooks are \(ThreadSanitizer.isActive ? "active" : "inactive")"
        )
    }

}
