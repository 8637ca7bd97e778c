/*
 * pv_test_util: small helpers the integration tests share.
 *
 *   pv_test_sh(fmt, ...)   runs a shell command (system()); a non-zero exit fails the test,
 *                          naming the command. Only while no process engine is open: the
 *                          engine's libev reaps every child of the process.
 *   pv_test_sleep_ms(ms)   sleeps, through signals.
 */
#ifndef PV_TEST_UTIL_H
#define PV_TEST_UTIL_H

void pv_test_sh(const char *fmt, ...) __attribute__((format(printf, 1, 2)));
void pv_test_sleep_ms(int ms);

#endif
