package job

import "time"

// ClockSkew is how far apart the clocks of Boxcar's machines may be: the workers, the NATS
// servers, the store, and the machines people run submit on. Where one of them judges a time
// another's clock wrote, it leaves ClockSkew of leeway on the side that keeps work going and
// keeps data: an approval request is past its expiry for the one who answers only ClockSkew
// after the expiry the worker set (the worker's own clock still ends its wait, and records
// so), and `submit gc` leaves a folder ClockSkew past its grace. docs/operations.md asks for
// clocks kept in step (NTP) well within it.
const ClockSkew = 10 * time.Minute
