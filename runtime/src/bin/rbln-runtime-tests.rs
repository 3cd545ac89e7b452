//! `rbln-runtime-tests MODEL.rbln INPUT.npy EXPECTED.npy`: guest-side
//! checks of the Runtime and AsyncRuntime APIs (run inside the VM).

use std::future::Future;
use std::path::Path;
use std::sync::Arc;
use std::task::{Context, Poll, Wake, Waker};

use rbln_runtime::{examples::max_errors, npy, AsyncRuntime, Error, Runtime, Tensor};

/// The smallest executor: park the thread until woken.
struct Unpark(std::thread::Thread);
impl Wake for Unpark {
    fn wake(self: Arc<Self>) {
        self.0.unpark();
    }
}

fn block_on<F: Future>(f: F) -> F::Output {
    let mut f = std::pin::pin!(f);
    let waker = Waker::from(Arc::new(Unpark(std::thread::current())));
    let mut cx = Context::from_waker(&waker);
    loop {
        match f.as_mut().poll(&mut cx) {
            Poll::Ready(v) => return v,
            Poll::Pending => std::thread::park(),
        }
    }
}

fn check(ok: bool, what: &str) -> Result<(), String> {
    if ok {
        println!("ok - {what}");
        Ok(())
    } else {
        Err(what.to_string())
    }
}

fn close(got: &Tensor, want: &Tensor) -> bool {
    got.shape == want.shape && max_errors(got, want).0 <= 1e-4 * (1.0 + want.data.to_f64().iter().fold(0f32, |m, v| m.max(v.abs() as f32)))
}

fn main() -> Result<(), String> {
    let a: Vec<String> = std::env::args().skip(1).collect();
    if a.len() != 3 {
        return Err("usage: rbln-runtime-tests MODEL.rbln INPUT.npy EXPECTED.npy".into());
    }
    let model = rbln_format::Model::open(&a[0]).map_err(|e| e.to_string())?;
    let x = npy::read(Path::new(&a[1]))?;
    let want = npy::read(Path::new(&a[2]))?;
    let dev = rbln_umd::Device::open(0).map_err(|e| e.to_string())?;

    let mut rt = Runtime::new(&dev, model.clone()).map_err(|e| e.to_string())?;
    check(rt.last_device_time().is_none(), "no device time before the first inference")?;
    let t0 = rbln_umd::clock::now();
    let y = rt.run(std::slice::from_ref(&x)).map_err(|e| e.to_string())?;
    let wall = t0.elapsed();
    check(close(&y[0], &want), "Runtime::run matches the CPU reference")?;
    let d = rt.last_device_time().ok_or("no device time after an inference")?;
    check(!d.is_zero() && d <= wall, &format!("the inference's device time ({d:?}) is within its wall time ({wall:?})"))?;
    let e = rt.run(&[]).unwrap_err();
    check(matches!(e, Error::InputCount { expected: 1, got: 0, .. }), &format!("no inputs: {e}"))?;
    let e = rt.run(&[Tensor::zeros(&[1, 2]), Tensor::zeros(&[1])]).unwrap_err();
    check(matches!(e, Error::InputCount { .. }), &format!("two inputs: {e}"))?;
    let mut wrong = x.clone();
    wrong.shape.reverse();
    let e = rt.run(&[wrong]).unwrap_err();
    let name = &model.meta.inputs[0].name;
    check(e.to_string().starts_with(&format!("input '{name}': expected shape")), &format!("wrong shape names the input: {e}"))?;
    let mut short = x.clone();
    short.as_f32_mut().ok_or("f32 input")?.pop();
    let e = rt.run(&[short]).unwrap_err();
    check(matches!(e, Error::InputLength { .. }), &format!("short data: {e}"))?;
    // A profiled submission of three back-to-back runs: the outputs of the
    // last, the events of one inference (in order, on the device clock),
    // the first run's span before them.
    let (y1, p1) = rt.profile(std::slice::from_ref(&x)).map_err(|e| e.to_string())?;
    let (y3, p3) = rt.profile_runs(&[x.view()], 3).map_err(|e| e.to_string())?;
    check(close(&y1[0], &want) && close(&y3[0], &want), "profiled runs (1 and 3 back to back) match the CPU reference")?;
    let names = |p: &rbln_runtime::Profile| p.events.iter().map(|e| e.name.clone()).collect::<Vec<_>>();
    check(!p1.events.is_empty() && names(&p1) == names(&p3), "three runs: the profile holds one inference's events")?;
    check((p1.runs(), p1.run_spans_ns.len(), p3.runs(), p3.run_spans_ns.len()) == (1, 1, 3, 3), "the profile says how many runs it timed, with each run's span")?;
    let last = |p: &rbln_runtime::Profile| {
        let start = p.events.iter().map(|e| e.start_ns).min().unwrap_or(0);
        p.events.iter().map(|e| e.start_ns + e.dur_ns).max().unwrap_or(0) - start
    };
    check(
        p3.run_spans_ns.iter().all(|&s| s > 0) && p3.run_spans_ns[2] == last(&p3) && p1.run_spans_ns[0] == last(&p1),
        "every run's span is on the device clock, the last one the span of the events",
    )?;
    check(p3.events.windows(2).all(|w| w[0].start_ns <= w[1].start_ns), "the last run's events are in order")?;
    for bad in [0, rbln_runtime::MAX_PROFILE_RUNS + 1] {
        let e = rt.profile_runs(&[x.view()], bad).unwrap_err();
        check(matches!(e, Error::ProfileRuns(n) if n == bad), &format!("profile runs {bad} refused: {e}"))?;
    }
    drop(rt);

    for parallel in [1, 2] {
        let mut art = AsyncRuntime::new(&dev, model.clone(), parallel).map_err(|e| e.to_string())?;
        // Many in flight: handles waited in submission order.
        let mut inputs = Vec::new();
        for i in 0..6 {
            let mut t = x.clone();
            t.as_f32_mut().ok_or("f32 input")?.iter_mut().for_each(|v| *v *= 1.0 + i as f32 / 8.0);
            inputs.push(t);
        }
        let handles: Vec<_> = inputs.iter().map(|t| art.run(std::slice::from_ref(t))).collect::<Result<_, _>>().map_err(|e| e.to_string())?;
        let results: Vec<_> = handles.into_iter().map(|h| h.wait()).collect::<Result<_, _>>().map_err(|e| e.to_string())?;
        // Request 0 used the reference input; the others must differ from it.
        check(close(&results[0][0], &want), &format!("parallel {parallel}: first of 6 in flight matches"))?;
        check(results[1..].iter().all(|r| r[0].data != results[0][0].data), &format!("parallel {parallel}: each request got its own outputs"))?;
        // A dropped handle loses nothing for the next requests.
        drop(art.run(std::slice::from_ref(&x)).map_err(|e| e.to_string())?);
        let fut = art.async_run(std::slice::from_ref(&x)).map_err(|e| e.to_string())?;
        let y = block_on(fut).map_err(|e| e.to_string())?;
        check(close(&y[0], &want), &format!("parallel {parallel}: Future (async_run) after a dropped handle"))?;
    }
    check(AsyncRuntime::new(&dev, model, 3).is_err(), "parallel 3 is refused")?;
    Ok(())
}
