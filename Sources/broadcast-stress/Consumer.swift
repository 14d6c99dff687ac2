import AsyncBroadcast

/// Where a consumer gets its iterator.
enum ConsumerSource: Sendable {
    /// Subscribed already (before sending, or by a producer); the box hands
    /// the `Subscription` over so the harness keeps no other reference.
    case subscription(TakeOnce<Stream.Subscription>)
    /// Subscribes itself with `sequence.makeAsyncIterator()`.
    case sequence
}

/// One subscriber's consumer task: reads until the end, following its plan
/// (slowness, leaving), and records what it saw.
enum Consumer {
    static func run(_ context: RoundContext, _ slot: SubscriberSlot, _ source: ConsumerSource) async {
        let plan = slot.plan
        let token = watchdog.register { slot.status() }
        defer { watchdog.unregister(token) }

        var record = ConsumerRecord(id: plan.id, policy: slot.policy)
        var subscription: Stream.Subscription?
        var iterator: Stream.Subscription.AsyncIterator?
        switch source {
        case .subscription(let box):
            record.join = slot.join
            if case .dropIteratorAfter = plan.leave {
                iterator = iteratorOnly(box)  // the iterator holds the only reference
            } else {
                subscription = box.take()
                iterator = subscription?.makeAsyncIterator()
            }
        case .sequence:
            let (join, made) = context.subscribeInConsumer()
            record.join = join
            iterator = made
        }
        guard iterator != nil else {
            slot.finish(record)
            return
        }
        record.joined = true

        var count = 0
        var sleeps = 0
        var left = false
        reading: while true {
            if !left {
                switch plan.leave {
                case .cancelAfter(let n) where count >= n:
                    left = true
                    subscription?.cancel()
                    // `cancel()` ends the subscriber at once: next() returns nil.
                    do {
                        if let item = try await iterator!.next() {
                            record.notes.append("next() returned \(Item.describe(item.key)) after cancel()")
                        }
                    } catch {
                        record.notes.append("next() threw StressError(\(error.code)) after cancel()")
                    }
                    record.end = .cancelledByConsumer
                    break reading
                case .dropIteratorAfter(let n) where count >= n:
                    left = true
                    iterator = nil  // releases the subscription: it ends
                    record.end = .droppedIterator
                    break reading
                case .cancelOwnTaskAfter(let n) where count >= n:
                    left = true
                    // Every call so far returned an element: `count` calls.
                    // The iterator reads the flag on calls 0, 32, 64, ...; the
                    // subscriber then ends as with cancel() (nil, buffer
                    // discarded). The checker bounds what arrives meanwhile.
                    record.ownTaskCancelledAfter = count
                    withUnsafeCurrentTask { $0?.cancel() }
                default:
                    break
                }
            }

            let next: Item?
            do {
                next = try await iterator!.next()
            } catch {
                record.end = .error(error.code)
                // The error is thrown once; after it, next() returns nil.
                await expectEnd(&iterator!, after: "the error", into: &record)
                break reading
            }
            guard let item = next else {
                record.end = .end
                await expectEnd(&iterator!, after: "nil", into: &record)
                break reading
            }
            if let problem = item.integrityProblem() { record.notes.append(problem) }
            record.received.append(item.key)
            count += 1
            slot.setReceived(count)

            switch plan.slowness {
            case .fast:
                break
            case .yielding(let every):
                if count % every == 0 { await Task.yield() }
            case .sleeping(let every, let micros, let maxSleeps):
                if count % every == 0 && sleeps < maxSleeps {
                    sleeps += 1
                    try? await Task.sleep(nanoseconds: UInt64(micros) * 1000)
                }
            }
        }
        // Final: the subscriber has ended (nil/error/cancel), so no more drops.
        record.droppedCount = subscription?.droppedCount
        slot.finish(record)
    }

    private static func iteratorOnly(_ box: TakeOnce<Stream.Subscription>) -> Stream.Subscription.AsyncIterator? {
        box.take()?.makeAsyncIterator()
    }

    private static func expectEnd(
        _ iterator: inout Stream.Subscription.AsyncIterator, after what: String,
        into record: inout ConsumerRecord
    ) async {
        do {
            if let item = try await iterator.next() {
                record.notes.append("next() returned \(Item.describe(item.key)) after \(what)")
            }
        } catch {
            record.notes.append("next() threw StressError(\(error.code)) after \(what)")
        }
    }
}
