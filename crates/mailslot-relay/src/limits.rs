//! Abuse limits: token buckets (per agent, per IP) and open-socket counts (per IP and in all).

use std::collections::HashMap;
use std::hash::Hash;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// A token bucket: `rate` tokens a second, at most `burst` saved up.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// Token buckets for every key (an agent, an IP) that was limited recently.
pub struct RateLimiter<K> {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<K, Bucket>>,
}

impl<K: Hash + Eq + Clone> RateLimiter<K> {
    /// A limiter allowing `rate` a second with bursts of `burst`.
    pub fn new(rate: f64, burst: f64) -> Self {
        Self {
            rate,
            burst: burst.max(1.0),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token for `key`, or says how long until one is free.
    pub fn take(&self, key: &K) -> Result<(), Duration> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        // Forget idle keys so the map stays as small as the set of active ones.
        if buckets.len() > 100_000 {
            let full_after = Duration::from_secs_f64(self.burst / self.rate.max(f64::MIN_POSITIVE));
            buckets.retain(|_, b| now.duration_since(b.updated) < full_after);
        }
        let bucket = buckets.entry(key.clone()).or_insert(Bucket {
            tokens: self.burst,
            updated: now,
        });
        let elapsed = now.duration_since(bucket.updated).as_secs_f64();
        bucket.tokens = (bucket.tokens + elapsed * self.rate).min(self.burst);
        bucket.updated = now;
        if bucket.tokens >= 1.0 {
            bucket.tokens -= 1.0;
            Ok(())
        } else {
            Err(Duration::from_secs_f64(
                (1.0 - bucket.tokens) / self.rate.max(f64::MIN_POSITIVE),
            ))
        }
    }

    /// Returns a token [`RateLimiter::take`] took for `key`, for an attempt that turned out
    /// not to count.
    pub fn give_back(&self, key: &K) {
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(bucket) = buckets.get_mut(key) {
            bucket.tokens = (bucket.tokens + 1.0).min(self.burst);
        }
    }
}

/// Counts open sockets, per client IP and in all, from accept to close.
pub struct ConnectionLimiter {
    per_ip: usize,
    total: usize,
    open: Mutex<Open>,
}

#[derive(Default)]
struct Open {
    by_ip: HashMap<IpAddr, usize>,
    total: usize,
}

/// Why a socket got no slot.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Full {
    /// This IP has `per_ip` sockets open.
    Ip(usize),
    /// The relay has `total` sockets open.
    Relay(usize),
}

/// Holds one connection slot; released on drop.
pub struct ConnectionSlot {
    limiter: Arc<ConnectionLimiter>,
    ip: IpAddr,
}

impl ConnectionLimiter {
    /// At most `per_ip` sockets per IP and `total` in all.
    pub fn new(per_ip: usize, total: usize) -> Self {
        Self {
            per_ip,
            total,
            open: Mutex::new(Open::default()),
        }
    }

    /// A slot for `ip`, or which limit is reached.
    pub fn acquire(self: &Arc<Self>, ip: IpAddr) -> Result<ConnectionSlot, Full> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        if open.total >= self.total {
            return Err(Full::Relay(self.total));
        }
        let n = open.by_ip.entry(ip).or_insert(0);
        if *n >= self.per_ip {
            return Err(Full::Ip(self.per_ip));
        }
        *n += 1;
        open.total += 1;
        Ok(ConnectionSlot {
            limiter: self.clone(),
            ip,
        })
    }

    /// Sockets open now.
    pub fn open(&self) -> usize {
        self.open.lock().unwrap_or_else(|e| e.into_inner()).total
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut open = self.limiter.open.lock().unwrap_or_else(|e| e.into_inner());
        open.total -= 1;
        if let Some(n) = open.by_ip.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.by_ip.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::protocol::AgentName;

    #[test]
    fn bucket_allows_the_burst_then_refuses_with_a_hint() {
        let limiter = RateLimiter::new(1.0, 3.0);
        let a = AgentName::new("a").unwrap();
        for _ in 0..3 {
            limiter.take(&a).unwrap();
        }
        let wait = limiter.take(&a).unwrap_err();
        assert!(
            wait > Duration::from_millis(900) && wait <= Duration::from_secs(1),
            "{wait:?}"
        );
        limiter
            .take(&AgentName::new("b").unwrap())
            .expect("buckets are per agent");
    }

    #[test]
    fn connection_slots_are_released_on_drop() {
        let limiter = Arc::new(ConnectionLimiter::new(2, 3));
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let other: IpAddr = "127.0.0.2".parse().unwrap();
        let a = limiter.acquire(ip).unwrap();
        let _b = limiter.acquire(ip).unwrap();
        assert_eq!(limiter.acquire(ip).err(), Some(Full::Ip(2)));
        let _c = limiter.acquire(other).unwrap();
        assert_eq!(limiter.acquire(other).err(), Some(Full::Relay(3)));
        drop(a);
        let _d = limiter.acquire(ip).expect("a released slot is free again");
        assert_eq!(limiter.open(), 3);
    }
}
