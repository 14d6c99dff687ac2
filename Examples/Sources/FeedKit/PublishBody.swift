/// The rules for a `POST /publish` body, checked on the bytes received,
/// before any database connection is touched: a body that breaks one is the
/// client's error (400 with the reason), never the database's.
public enum PublishBody {
    /// PostgreSQL refuses NOTIFY payloads of 8000 bytes or more.
    public static let maximumBytes = 7_999

    /// The body as text, or the reason it is refused (one line).
    ///
    /// - at most ``maximumBytes`` bytes, counted as received;
    /// - valid UTF-8 (nothing is replaced with U+FFFD);
    /// - no control character but tab, LF and CR: PostgreSQL refuses NUL
    ///   (`invalid byte sequence for encoding "UTF8": 0x00`), and the others
    ///   would take six bytes each in every frame (`\u0001`), which the
    ///   `capacity` ceiling would have to allow for. U+0001 also marks the
    ///   server's own shutdown barrier on the channel, which no client can forge.
    public static func validate(_ bytes: some Collection<UInt8>) -> Result<String, BadFeedQuery> {
        guard bytes.count <= maximumBytes else {
            return .failure(tooLarge(bytes.count, exact: true))
        }
        var iterator = bytes.makeIterator()
        var decoder = UTF8()
        var offset = 0
        var text = ""
        text.reserveCapacity(bytes.count)
        while true {
            switch decoder.decode(&iterator) {
            case .scalarValue(let scalar):
                if scalar.value < 0x20 && scalar != "\t" && scalar != "\n" && scalar != "\r" {
                    let name = scalar.value == 0 ? "NUL" : "control character"
                    let code = "U+" + String(repeating: "0", count: 4 - String(scalar.value, radix: 16).count)
                        + String(scalar.value, radix: 16, uppercase: true)
                    return .failure(BadFeedQuery("\(name) (\(code)) at byte \(offset): a message is text without control characters but tab, LF and CR"))
                }
                text.unicodeScalars.append(scalar)
                offset += UTF8.width(scalar)
            case .emptyInput:
                return .success(text)
            case .error:
                return .failure(BadFeedQuery("the body is not valid UTF-8 (at byte \(offset))"))
            }
        }
    }

    /// The reason for a body over the limit: `count` bytes (`exact`, from
    /// `Content-Length` or the whole body), or more than the limit (the
    /// server stopped reading there).
    public static func tooLarge(_ count: Int, exact: Bool) -> BadFeedQuery {
        BadFeedQuery("payload is \(exact ? "\(count)" : "more than \(maximumBytes)") bytes: NOTIFY takes fewer than 8000")
    }
}
