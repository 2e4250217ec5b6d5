//! Abuse limits: per-agent token buckets and per-IP connection counts.

use std::collections::HashMap;
use std::net::IpAddr;
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use crate::protocol::AgentName;

/// A token bucket: `rate` tokens a second, at most `burst` saved up.
#[derive(Debug, Clone, Copy)]
struct Bucket {
    tokens: f64,
    updated: Instant,
}

/// Token buckets for every agent that sent recently.
pub struct RateLimiter {
    rate: f64,
    burst: f64,
    buckets: Mutex<HashMap<AgentName, Bucket>>,
}

impl RateLimiter {
    /// A limiter allowing `rate` a second with bursts of `burst`.
    pub fn new(rate: f64, burst: f64) -> Self {
        Self {
            rate,
            burst: burst.max(1.0),
            buckets: Mutex::new(HashMap::new()),
        }
    }

    /// Takes one token for `agent`, or says how long until one is free.
    pub fn take(&self, agent: &AgentName) -> Result<(), Duration> {
        let now = Instant::now();
        let mut buckets = self.buckets.lock().unwrap_or_else(|e| e.into_inner());
        // Forget idle agents so the map stays as small as the set of active senders.
        if buckets.len() > 100_000 {
            let full_after = Duration::from_secs_f64(self.burst / self.rate.max(f64::MIN_POSITIVE));
            buckets.retain(|_, b| now.duration_since(b.updated) < full_after);
        }
        let bucket = buckets.entry(agent.clone()).or_insert(Bucket {
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
}

/// Counts open sockets per client IP.
pub struct ConnectionLimiter {
    max: usize,
    open: Mutex<HashMap<IpAddr, usize>>,
}

/// Holds one connection slot; released on drop.
pub struct ConnectionSlot {
    limiter: Arc<ConnectionLimiter>,
    ip: IpAddr,
}

impl ConnectionLimiter {
    /// At most `max` sockets per IP.
    pub fn new(max: usize) -> Self {
        Self {
            max,
            open: Mutex::new(HashMap::new()),
        }
    }

    /// A slot for `ip`, or `None` when it has too many.
    pub fn acquire(self: &Arc<Self>, ip: IpAddr) -> Option<ConnectionSlot> {
        let mut open = self.open.lock().unwrap_or_else(|e| e.into_inner());
        let n = open.entry(ip).or_insert(0);
        if *n >= self.max {
            return None;
        }
        *n += 1;
        Some(ConnectionSlot {
            limiter: self.clone(),
            ip,
        })
    }
}

impl Drop for ConnectionSlot {
    fn drop(&mut self) {
        let mut open = self.limiter.open.lock().unwrap_or_else(|e| e.into_inner());
        if let Some(n) = open.get_mut(&self.ip) {
            *n -= 1;
            if *n == 0 {
                open.remove(&self.ip);
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        let limiter = Arc::new(ConnectionLimiter::new(2));
        let ip: IpAddr = "127.0.0.1".parse().unwrap();
        let a = limiter.acquire(ip).unwrap();
        let _b = limiter.acquire(ip).unwrap();
        assert!(limiter.acquire(ip).is_none());
        drop(a);
        assert!(limiter.acquire(ip).is_some());
    }
}
