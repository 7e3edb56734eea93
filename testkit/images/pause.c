/* The Pod sandbox's process for the test nodes' containerd (its `sandbox_image`), built
 * with `cc -static` by the test harness: it holds the Pod's namespaces, reaps orphans, and
 * exits on SIGINT or SIGTERM. No registry is reachable here, so the sandbox image is made
 * locally, as Kubernetes' own pause image is made from a C file. */
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

static void stop(int sig) {
	(void)sig;
	_exit(0);
}

static void reap(int sig) {
	(void)sig;
	while (waitpid(-1, NULL, WNOHANG) > 0) {
	}
}

int main(void) {
	struct sigaction quit = {.sa_handler = stop};
	struct sigaction child = {.sa_handler = reap, .sa_flags = SA_NOCLDSTOP};
	sigaction(SIGINT, &quit, NULL);
	sigaction(SIGTERM, &quit, NULL);
	sigaction(SIGCHLD, &child, NULL);
	for (;;) {
		pause();
	}
}
