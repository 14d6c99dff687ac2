#if canImport(Glibc)
import Glibc
#elseif canImport(Darwin)
import Darwin
#endif

/// The decoded program, step by step, with what the library answered.
///
/// Formatting every step would cost most of the fuzzing time, so programs
/// run untraced; on a finding the same input is run again, traced (both
/// targets are deterministic), and that run prints the program with the
/// expected/actual diff and traps (libFuzzer then saves the input).
public final class Trace {
    public private(set) var lines: [String] = []
    public let enabled: Bool
    let echo: Bool

    /// `FUZZ_TRACE=1` traces (and prints) every program as it runs.
    public static let alwaysTrace = getenv("FUZZ_TRACE") != nil
    /// Set by a target: runs the current input again with `Trace(enabled: true)`.
    nonisolated(unsafe) public static var rerunTraced: (() -> Void)?

    public init(enabled: Bool = Trace.alwaysTrace) {
        self.enabled = enabled
        echo = Trace.alwaysTrace
    }

    public func add(_ line: @autoclosure () -> String) {
        guard enabled else { return }
        lines.append(line())
        if echo { printErr(format4(lines.count - 1) + "  " + lines[lines.count - 1]) }
    }

    /// Appends to the last line (the outcome of the step just recorded).
    public func annotate(_ text: @autoclosure () -> String) {
        guard enabled, !lines.isEmpty else { return }
        let text = text()
        lines[lines.count - 1] += text
        if echo { printErr("        " + text) }
    }

    public func fail(_ message: @autoclosure () -> String, details: @autoclosure () -> String = "") -> Never {
        let message = message()
        if !enabled, let rerun = Trace.rerunTraced {
            Trace.rerunTraced = nil
            rerun()  // traps with the full report if the finding reproduces
            printErr("(the traced re-run did not reproduce the finding)")
        }
        var out = "\n==== AsyncBroadcast fuzz finding ====\nprogram:\n"
        for (index, line) in lines.enumerated() {
            out += (index == lines.count - 1 ? "=> " : "   ") + format4(index) + "  " + line + "\n"
        }
        out += "\nMISMATCH at step \(Swift.max(lines.count - 1, 0)): \(message)\n"
        let details = details()
        if !details.isEmpty { out += details + "\n" }
        out += "====================================\n"
        printErr(out)
        fatalError("AsyncBroadcast fuzz finding: \(message)")
    }
}

func format4(_ n: Int) -> String {
    let s = String(n)
    return String(repeating: " ", count: Swift.max(0, 4 - s.count)) + s
}

public func printErr(_ s: String) {
    fputs(s + "\n", stderr)
}

/// Compares and fails with a readable diff.
public func expectEqual<T: Equatable>(_ actual: T, _ expected: T, _ what: @autoclosure () -> String,
                                      _ trace: Trace, details: @autoclosure () -> String = "") {
    if actual != expected {
        trace.fail("\(what()): expected \(expected), got \(actual)", details: details())
    }
}
