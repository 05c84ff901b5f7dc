/* Orders OneFlow 0.9's lazy-job queue: an nn.Graph run that ends before its launch has queued it.
 *
 * LaunchLazyJobInstructionPolicy::Compute (oneflow/core/vm/lazy_job_instruction_policy.h) hands
 * the run to the graph's actors (BufferMgr Push) and only then calls
 * LazyJobStreamPolicy::EnqueueNNGraph; the run's finish callback calls DequeueNNGraph. When the
 * launching thread is descheduled between the two (any loaded machine), a short run ends first and
 * DequeueNNGraph pops an empty std::queue: heap corruption, then a segfault in DequeueNNGraph or in
 * the next launch's WaitUntilQueueEmptyIfFrontNNGraphNotEquals, or a hang there. How often launches
 * come in that order: bench/graph_launch_race.py ("reordered"; docs/benchmarks.md).
 *
 * liboneflow calls both methods through its PLT, so these definitions, loaded RTLD_GLOBAL before
 * it, take their place: per queue they count what is queued; a dequeue with nothing queued is
 * remembered and cancels the enqueue it overtook, so the queue holds what OneFlow intends. The
 * originals do the work otherwise (looked up in liboneflow itself). */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <link.h>
#include <pthread.h>
#include <string.h>

#define ENQ "_ZN7oneflow2vm19LazyJobStreamPolicy14EnqueueNNGraphERKSt10shared_ptrINS_9NNGraphIfEE"
#define DEQ "_ZN7oneflow2vm19LazyJobStreamPolicy14DequeueNNGraphEv"
#define SLOTS 256

typedef void (*enq_fn)(void *, const void *);
typedef void (*deq_fn)(void *);
static enq_fn real_enq;
static deq_fn real_deq;
static pthread_mutex_t mu = PTHREAD_MUTEX_INITIALIZER;
static struct { void *queue; long queued, early; } slots[SLOTS];
static long reordered, launches;

static int find_liboneflow(struct dl_phdr_info *info, size_t size, void *out) {
  (void)size;
  if (info->dlpi_name && strstr(info->dlpi_name, "/liboneflow")) {
    void *h = dlopen(info->dlpi_name, RTLD_LAZY | RTLD_NOLOAD);
    if (h) { *(void **)out = h; return 1; }
  }
  return 0;
}

static int resolve(void) { /* under mu */
  if (real_enq && real_deq) return 1;
  void *h = NULL;
  dl_iterate_phdr(find_liboneflow, &h);
  if (!h) return 0;
  real_enq = (enq_fn)dlsym(h, ENQ);
  real_deq = (deq_fn)dlsym(h, DEQ);
  return real_enq && real_deq;
}

static int slot(void *queue) { /* under mu; a process has one lazy-job stream per device */
  int free_i = -1;
  for (int i = 0; i < SLOTS; i++) {
    if (slots[i].queue == queue) return i;
    if (!slots[i].queue && free_i < 0) free_i = i;
  }
  if (free_i < 0) free_i = 0;
  slots[free_i].queue = queue;
  slots[free_i].queued = slots[free_i].early = 0;
  return free_i;
}

void _ZN7oneflow2vm19LazyJobStreamPolicy14EnqueueNNGraphERKSt10shared_ptrINS_9NNGraphIfEE(void *self, const void *graph) {
  pthread_mutex_lock(&mu);
  if (!resolve()) { pthread_mutex_unlock(&mu); return; } /* not reached: liboneflow is the caller */
  int i = slot(self);
  launches++;
  if (slots[i].early > 0) {
    slots[i].early--; /* this run has ended already: nothing to queue */
  } else {
    slots[i].queued++;
    real_enq(self, graph);
  }
  pthread_mutex_unlock(&mu);
}

void _ZN7oneflow2vm19LazyJobStreamPolicy14DequeueNNGraphEv(void *self) {
  pthread_mutex_lock(&mu);
  if (!resolve()) { pthread_mutex_unlock(&mu); return; }
  int i = slot(self);
  if (slots[i].queued == 0) {
    slots[i].early++; /* ended before its launch queued it: cancel that enqueue instead */
    reordered++;
  } else {
    slots[i].queued--;
    real_deq(self);
  }
  pthread_mutex_unlock(&mu);
}

int bert_of_oneflow_fix_ready(void) {
  pthread_mutex_lock(&mu);
  int ok = resolve();
  pthread_mutex_unlock(&mu);
  return ok;
}

long bert_of_oneflow_fix_launches(void) { return launches; }
long bert_of_oneflow_fix_reordered(void) { return reordered; }
