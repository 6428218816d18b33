/*
 * target.c: the targets by name, and the device header they share.
 *
 * One list serves the C API, `fusec run --device` and Python: a target
 * added here is reachable from all three. A device is shared by every
 * program of the process that runs on it (so a key's code is loaded once)
 * and counted: the last fz_device_release frees its kernel store and
 * closes it.
 */
#include <stdlib.h>
#include <string.h>

#include "kernels.h"
#include "target.h"

static const fz_target *const targets[] = {
	&fz_target_cpu,
	&fz_target_cuda,
	&fz_target_emu,
};

const fz_target *fz_target_find(const char *name)
{
	for (size_t i = 0; name && i < sizeof targets / sizeof *targets; i++)
		if (!strcmp(targets[i]->name, name))
			return targets[i];
	return NULL;
}

const char *fz_target_names(void)
{
	static char buf[128];
	if (!buf[0])
		for (size_t i = 0; i < sizeof targets / sizeof *targets; i++) {
			if (i)
				strcat(buf, ", ");
			strcat(buf, targets[i]->name);
		}
	return buf;
}

fz_status fz_device_init(fz_device *dev, const fz_target *tg, char **err)
{
	dev->tg = tg;
	dev->refs = 1;
	if (pthread_mutex_init(&dev->mu, NULL)) {
		if (err)
			*err = fz_strdup("cannot create a mutex");
		return FZ_ERUNTIME;
	}
	return FZ_OK;
}

/* Devices are few and long-lived: one lock for all reference counts. */
static pthread_mutex_t refs_mu = PTHREAD_MUTEX_INITIALIZER;

void fz_device_retain(fz_device *dev)
{
	pthread_mutex_lock(&refs_mu);
	dev->refs++;
	pthread_mutex_unlock(&refs_mu);
}

bool fz_device_try_retain(fz_device *dev)
{
	pthread_mutex_lock(&refs_mu);
	bool ok = dev->refs > 0;
	if (ok)
		dev->refs++;
	pthread_mutex_unlock(&refs_mu);
	return ok;
}

void fz_device_release(fz_device *dev)
{
	if (!dev)
		return;
	pthread_mutex_lock(&refs_mu);
	bool last = --dev->refs == 0;
	pthread_mutex_unlock(&refs_mu);
	if (!last)
		return;
	fz_kstore_free(dev->store);
	dev->store = NULL;
	pthread_mutex_destroy(&dev->mu);
	dev->tg->close(dev);
}

static _Thread_local long host_syncs;

void fz_host_sync_note(void) { host_syncs++; }

long fz_host_sync_count(void) { return host_syncs; }
