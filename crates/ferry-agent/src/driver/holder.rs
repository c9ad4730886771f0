//! Watching what holds a located volume exposed, from when it was found until its data has
//! moved: a holding pod deleted, evicted or preempted meanwhile stops the data path, and the
//! CR fails rather than complete with data missing.

use std::sync::{Arc, Mutex, PoisonError};

use tokio::task::JoinHandle;
use tokio_util::sync::CancellationToken;

use crate::ExposedVolume;
use crate::context::Ctx;
use crate::error::{WorkError, error_chain};
use crate::resource::MoverCr;

/// The bound on the last look before a CR completes.
const LAST_LOOK_TIMEOUT: std::time::Duration = std::time::Duration::from_secs(30);

/// A running watch; stops when dropped.
pub(super) struct HolderWatch {
    token: CancellationToken,
    lost: Arc<Mutex<Option<String>>>,
    task: Option<JoinHandle<()>>,
}

impl HolderWatch {
    /// Starts asking the exposer every holder check interval whether `volume` is still held.
    pub(super) fn start<C: MoverCr>(
        ctx: &Arc<Ctx<C>>,
        cr: &C,
        volume: &ExposedVolume,
        work: &CancellationToken,
    ) -> Self {
        let token = work.child_token();
        let lost = Arc::new(Mutex::new(None));
        // The watch needs the holder's identity, not the volume's descriptor: releasing the
        // volume must close it.
        let identity = ExposedVolume { root: None, ..volume.clone() };
        let task = tokio::spawn(watch(
            Arc::clone(ctx),
            cr.clone(),
            identity,
            token.clone(),
            Arc::clone(&lost),
        ));
        Self { token, lost, task: Some(task) }
    }

    /// The token the slot wait and the data path run under: fires with the work token, and
    /// when the holder is lost.
    pub(super) fn token(&self) -> &CancellationToken {
        &self.token
    }

    /// Why the volume is no longer held, once it is not.
    pub(super) fn lost(&self) -> Option<String> {
        self.lost.lock().unwrap_or_else(PoisonError::into_inner).clone()
    }

    /// Stops watching and asks once more, now: `Some(reason)` when the holder is gone.
    pub(super) async fn last_look<C: MoverCr>(
        mut self,
        ctx: &Ctx<C>,
        cr: &C,
        volume: &ExposedVolume,
    ) -> Result<(), String> {
        if let Some(task) = self.task.take() {
            task.abort();
        }
        if let Some(reason) = self.lost() {
            return Err(reason);
        }
        // The volume stayed open throughout, so an exposer that cannot answer in time does
        // not hold the CR back.
        let asked = C::exposer(&ctx.backends).still_held(cr, volume);
        match tokio::time::timeout(LAST_LOOK_TIMEOUT, asked).await {
            Ok(Ok(()) | Err(WorkError::Canceled)) | Err(_) => Ok(()),
            Ok(Err(e)) => Err(error_chain(&e)),
        }
    }
}

impl Drop for HolderWatch {
    fn drop(&mut self) {
        if let Some(task) = &self.task {
            task.abort();
        }
    }
}

async fn watch<C: MoverCr>(
    ctx: Arc<Ctx<C>>,
    cr: C,
    volume: ExposedVolume,
    token: CancellationToken,
    lost: Arc<Mutex<Option<String>>>,
) {
    let exposer = C::exposer(&ctx.backends);
    loop {
        tokio::select! {
            () = token.cancelled() => return,
            () = tokio::time::sleep(ctx.config.holder_check_interval) => {}
        }
        let checked = tokio::select! {
            checked = exposer.still_held(&cr, &volume) => checked,
            () = token.cancelled() => return,
        };
        match checked {
            Ok(()) => {}
            Err(WorkError::Canceled) => return,
            Err(e) => {
                *lost.lock().unwrap_or_else(PoisonError::into_inner) = Some(error_chain(&e));
                token.cancel();
                return;
            }
        }
    }
}
