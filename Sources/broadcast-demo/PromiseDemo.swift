import AsyncBroadcast

enum ConfigError: Error {
    case missing
}

/// Three waiters and a late one get the same result; a cancelled waiter
/// stops waiting with `CancellationError`; a second completion is refused.
func promiseDemo() async {
    let config = BroadcastPromise(of: String.self, throwing: ConfigError.self)

    let waiters = (1...3).map { number in
        Task { () -> String in
            do { return "waiter \(number): \(try await config.value)" } catch { return "waiter \(number): \(error)" }
        }
    }
    let impatient = Task { () -> String in
        do { return "impatient waiter: \(try await config.value)" } catch is CancellationError { return "impatient waiter: cancelled (CancellationError), no longer waiting" } catch { return "impatient waiter: \(error)" }
    }
    impatient.cancel()
    print(await impatient.value)

    print("result before completion: \(config.result.map { "\($0)" } ?? "nil")")
    print("succeed(\"dark theme\") -> \(config.succeed("dark theme"))")
    print("fail(.missing) -> \(config.fail(.missing)) (already completed: changes nothing)")
    for waiter in waiters {
        print(await waiter.value)
    }
    do {
        print("late waiter: \(try await config.value) (at once)")
    } catch {
        print("late waiter: \(error)")
    }
}
